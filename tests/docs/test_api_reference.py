"""The tool API reference is generated from the docstrings and kept in step with them."""

import subprocess
import sys

from tests.conftest import repo_root


def test_the_checked_in_reference_matches_the_docstrings() -> None:
    checked = subprocess.run(
        [sys.executable, "docs/api_reference.py", "--check"], cwd=repo_root(), timeout=60
    )
    assert checked.returncode == 0, "docs/tool-api.md is stale: run `make docs`"


def test_the_reference_covers_every_public_name() -> None:
    from onceflow import tools as onceflow_tools

    page = (repo_root() / "docs" / "tool-api.md").read_text()
    missing = [name for name in onceflow_tools.__all__ if f"`{name}" not in page]
    assert missing == []
