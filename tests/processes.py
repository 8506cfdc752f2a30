"""Runs onceflow's own commands as real processes for tests (workers, the dev stack)."""

import os
import select
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def onceflow_command(*arguments: str) -> list[str]:
    """The ``onceflow`` console script of this interpreter's environment."""
    return [sys.executable, "-m", "onceflow.cli", *arguments]


def spawn(arguments: list[str], *, env: dict[str, str], cwd: Path = REPO) -> subprocess.Popen[str]:
    """Start a process with stdout captured line by line (stderr merged into it)."""
    return subprocess.Popen(
        arguments,
        cwd=cwd,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )


def wait_for_line(
    process: subprocess.Popen[str], needle: str, *, timeout: float = 60
) -> list[str]:
    """Read the process's output until a line contains ``needle``; returns the lines read.

    Reads the raw descriptor: ``select`` on a buffered text stream misses lines that
    arrived in one burst and already sit in the buffer.
    """
    assert process.stdout is not None
    descriptor = process.stdout.fileno()
    seen: list[str] = []
    pending = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([descriptor], [], [], 0.2)
        chunk = os.read(descriptor, 65536) if ready else b""
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for raw in complete:
            line = raw.decode(errors="replace").rstrip()
            seen.append(line)
            if needle in line:
                return seen
        if ready and not chunk or (not ready and process.poll() is not None):
            raise AssertionError(
                f"process exited ({process.poll()}) before printing {needle!r}:\n"
                + "\n".join(seen)
                + pending.decode(errors="replace")
            )
    raise AssertionError(f"no line with {needle!r} within {timeout}s:\n" + "\n".join(seen))


def stop(process: subprocess.Popen[str], *, timeout: float = 30) -> str:
    """SIGTERM the process, wait for it, and return the rest of its output."""
    if process.poll() is None:
        process.terminate()
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
    unread: bytes = getattr(process, "_unread_output", b"")
    return unread.decode(errors="replace") + (output or "")
