"""Every relative link in README.md and docs/*.md leads to a file that exists, and every
``#anchor`` to a heading of the page it names (GitHub's heading ids)."""

import re
from pathlib import Path

import pytest

from tests.conftest import repo_root

LINK = re.compile(r"!?\[(?:[^\]]|\][^(])*?\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
"""``[text](target)`` and ``![alt](target)``, an optional title after the target."""
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", flags=re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", flags=re.DOTALL)
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", flags=re.MULTILINE)


def pages() -> list[Path]:
    root = repo_root()
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def prose(markdown: str) -> str:
    """The text outside code blocks and code spans, where links are links."""
    return CODE_SPAN.sub("", FENCE.sub("", markdown))


def anchors(markdown: str) -> set[str]:
    """The ids GitHub gives the page's headings (a repeated one gets ``-1``, ``-2``…)."""
    seen: dict[str, int] = {}
    ids = set()
    for title in HEADING.findall(FENCE.sub("", markdown)):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        ids.add(slug if count == 0 else f"{slug}-{count}")
    return ids


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:…
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text()):
            broken.append(f"{target}: no heading with that id")
    return broken


@pytest.mark.parametrize("page", pages(), ids=lambda page: page.name)
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_readme_links_every_page_of_the_docs() -> None:
    readme = prose((repo_root() / "README.md").read_text())
    linked = {target.partition("#")[0] for target in LINK.findall(readme)}
    unlinked = [
        page.name
        for page in sorted((repo_root() / "docs").glob("*.md"))
        if f"docs/{page.name}" not in linked
    ]
    assert unlinked == []
