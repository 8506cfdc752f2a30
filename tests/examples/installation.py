"""How the tests of examples/ install an example and run its processes.

An example is installed offline into a private folder from a copy of its sources, as a
user installs a third-party package (the build leaves nothing in the repository); its
processes write to log files, and a test waits for the line saying each is ready.
"""

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from tests.harness import HANG_SECONDS, REPO, eventually_blocking


def install_example(example: Path, into: Path) -> Path:
    """Install ``example`` offline into ``into/site``; returns the folder to put on
    ``PYTHONPATH``."""
    source = into / "src"
    shutil.copytree(
        example, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    site = into / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(site),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    distribution = f"onceflow_example_{example.name}-*.dist-info/entry_points.txt"
    assert list(site.glob(distribution)), f"{example.name} declares no entry points"
    return site


def start(arguments: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start a long-running process with its output going to ``log`` (never a full pipe)."""
    with log.open("wb") as stream:
        return subprocess.Popen(
            arguments,
            cwd=REPO,
            env={**os.environ, **env},
            stdout=stream,
            stderr=subprocess.STDOUT,
        )


def wait_for(process: subprocess.Popen[bytes], log: Path, pattern: str) -> re.Match[str]:
    """Wait until ``log`` has a line matching ``pattern``; fail at once if the process exits."""

    def search() -> re.Match[str] | None:
        text = log.read_text(errors="replace")
        found = re.search(pattern, text)
        if not found and process.poll() is not None:
            raise AssertionError(f"{log.name}: exited ({process.returncode}):\n{text}")
        return found

    return eventually_blocking(
        search,
        what=lambda: f"{log.name} shows {pattern!r}:\n{log.read_text(errors='replace')}",
        timeout=60,
    )


def stop_all(processes: Iterable[subprocess.Popen[bytes]]) -> None:
    """Terminate the processes, newest first, and wait for each (killed if it hangs)."""
    started = list(processes)
    for process in reversed(started):
        process.terminate()
    for process in started:
        try:
            process.wait(timeout=HANG_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
