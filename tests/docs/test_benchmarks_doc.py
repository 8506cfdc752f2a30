"""BENCHMARKS.md is generated from bench/results/*.json and kept in step with them.

Reads the results files only: no benchmark runs here, and nothing is timed.
"""

import subprocess
import sys

from tests.conftest import repo_root


def test_the_checked_in_benchmarks_page_matches_the_results_files() -> None:
    checked = subprocess.run(
        [sys.executable, "-m", "bench.write_benchmarks", "--check"],
        cwd=repo_root(),
        timeout=60,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, (
        "BENCHMARKS.md is stale: run `.venv/bin/python -m bench.write_benchmarks`\n"
        + checked.stderr
    )


def test_every_plot_the_page_shows_is_in_the_results_folder() -> None:
    page = (repo_root() / "BENCHMARKS.md").read_text()
    shown = [
        line.split("](", 1)[1].rstrip(")") for line in page.splitlines() if line.startswith("![")
    ]
    assert shown, "the page shows no plot"
    missing = [path for path in shown if not (repo_root() / path).is_file()]
    assert missing == []
