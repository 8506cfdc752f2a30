"""Runs onceflow's own commands (and the dev stack's) as real processes and waits until
each says it is ready: on a line of its output, never after a fixed pause.

Two shapes: ``spawn`` keeps the output on a pipe (read it with ``wait_for_line``); a
process writing to a log file is waited on with ``log_line`` (async) or
``log_line_blocking``. Either fails at once, with the output so far, if the process exits
before printing the line.
"""

import asyncio
import os
import select
import subprocess
import sys
import time
from pathlib import Path

from ._eventually import HANG_SECONDS, eventually, eventually_blocking

REPO = Path(__file__).resolve().parent.parent.parent

Process = subprocess.Popen[str] | subprocess.Popen[bytes] | asyncio.subprocess.Process


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
    process: subprocess.Popen[str], needle: str, *, timeout: float = HANG_SECONDS
) -> list[str]:
    """Read the process's output until a line contains ``needle``; returns the lines read.

    Reads the raw descriptor: ``select`` on a buffered text stream misses lines that
    arrived in one burst and already sit in the buffer. ``select`` is the wait here: it
    returns as soon as the process writes.
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


def stop(process: subprocess.Popen[str], *, timeout: float = HANG_SECONDS) -> str:
    """SIGTERM the process, wait for it, and return the rest of its output.

    A process still running after ``timeout`` (a hang) is killed.
    """
    if process.poll() is None:
        process.terminate()
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
    unread: bytes = getattr(process, "_unread_output", b"")
    return unread.decode(errors="replace") + (output or "")


async def log_line(
    process: Process, log_path: Path, needle: str, *, timeout: float = HANG_SECONDS
) -> str:
    """Wait until the process's log file has a line containing ``needle``; returns it.

    Raises:
        AssertionError: The process exited first, or no such line within ``timeout``
            (either with the log so far).
    """
    return await eventually(
        lambda: _find_line(process, log_path, needle),
        what=lambda: f"{log_path.name} shows a line with {needle!r}:\n{_tail(log_path)}",
        timeout=timeout,
    )


def log_line_blocking(
    process: Process, log_path: Path, needle: str, *, timeout: float = HANG_SECONDS
) -> str:
    """:func:`log_line` for code without an event loop (sync fixtures)."""
    return eventually_blocking(
        lambda: _find_line(process, log_path, needle),
        what=lambda: f"{log_path.name} shows a line with {needle!r}:\n{_tail(log_path)}",
        timeout=timeout,
    )


def _find_line(process: Process, log_path: Path, needle: str) -> str:
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    for line in text.splitlines():
        if needle in line:
            return line
    if isinstance(process, asyncio.subprocess.Process):
        exited = process.returncode
    else:
        exited = process.poll()
    if exited is not None:
        raise AssertionError(f"{log_path.name}: exited ({exited}) before {needle!r}:\n{text}")
    return ""


def _tail(log_path: Path) -> str:
    return log_path.read_text(errors="replace")[-4000:] if log_path.exists() else ""
