"""The previous release's server package, kept in the repository for the upgrade test.

The upgrade test runs a release's own code, not a simulation of it, and a clone in CI may
carry no history to check it out from. So each release the current code upgrades from is
kept as ``releases/onceflow-<version>.tar.gz``: ``git archive <commit> onceflow`` of the
commit CHANGELOG.md names for it (the server package only: a release's pinned
dependencies are the current ones, ``git diff <commit> HEAD -- pyproject.toml`` shows only
test extras changed). git stores the commit id in the archive's header, so the test
checks the archive is the release CHANGELOG.md names. Write it once, when a release is
recorded in CHANGELOG.md::

    python -m tests.upgrade.release_archive            # the previous release
    python -m tests.upgrade.release_archive 0.1.0      # a named one
"""

import re
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHANGELOG = REPO / "CHANGELOG.md"
RELEASES = Path(__file__).resolve().parent / "releases"
PACKAGE = "onceflow"
"""What an archive holds: the server package, which is what the release's processes run."""

_ENTRY = re.compile(r"^## (?P<version>\S+) — (?P<date>\S+) — commit `(?P<commit>[0-9a-f]{7,40})`$")


def released_commits() -> dict[str, str]:
    """Version -> commit of every CHANGELOG.md entry that names its commit, newest first
    (the entry of the code being written names none yet)."""
    found = {}
    for line in CHANGELOG.read_text().splitlines():
        if match := _ENTRY.match(line):
            found[match["version"]] = match["commit"]
    return found


def previous_release() -> str:
    """The release the current code upgrades from: the newest entry with a commit that is
    not the current version (once the current release's entry names its commit, it stays
    the previous release's job until the version moves on)."""
    from onceflow import __version__

    releases = [version for version in released_commits() if version != __version__]
    if not releases:
        raise LookupError(f"{CHANGELOG.name} names no earlier release's commit")
    return releases[0]


def archive_path(version: str) -> Path:
    """Where the archive of ``version`` is kept."""
    return RELEASES / f"{PACKAGE}-{version}.tar.gz"


def archived_commit(path: Path) -> str:
    """The commit id ``git archive`` stored in the archive's header (what
    ``git get-tar-commit-id`` reads)."""
    with tarfile.open(path) as archive:
        return archive.pax_headers["comment"]


def write_archive(version: str) -> Path:
    """Write ``git archive <commit> onceflow`` of ``version`` to its ``archive_path``.

    Raises:
        LookupError: CHANGELOG.md names no commit for ``version``.
        subprocess.CalledProcessError: git cannot read the commit (a shallow clone).
    """
    commit = released_commits().get(version)
    if commit is None:
        raise LookupError(f"{CHANGELOG.name} names no commit for {version}")
    path = archive_path(version)
    path.parent.mkdir(parents=True, exist_ok=True)
    # git compresses with ``gzip -n`` (no name, no time): the same commit gives the same bytes.
    subprocess.run(
        ["git", "archive", "--format=tar.gz", f"--output={path}", commit, PACKAGE],
        cwd=REPO,
        check=True,
    )
    return path


def main(arguments: list[str]) -> None:
    version = arguments[0] if arguments else previous_release()
    path = write_archive(version)
    print(f"{path.relative_to(REPO)}: {PACKAGE}/ of {version} ({archived_commit(path)[:12]})")


if __name__ == "__main__":
    main(sys.argv[1:])
