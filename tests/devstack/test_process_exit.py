"""Waiting for a process that is not the caller's child: the stack's PostgreSQL server and
a Temporal dev server a crashed stack left behind are such processes."""

import signal
import subprocess

from onceflow_devstack.process_exit import watched

from tests.harness import HANG_SECONDS


def orphan(script: str) -> int:
    """Start ``script`` from a shell that exits at once: the process is nobody's child
    here, and once it exits it stays a zombie nobody reaps (as under a container's init)."""
    shell = subprocess.run(
        ["bash", "-c", f"( {script} ) >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
        timeout=HANG_SECONDS,
    )
    return int(shell.stdout)


def test_an_orphan_that_exits_is_gone_though_nobody_reaps_it() -> None:
    pid = orphan("exec sleep 600")
    with watched(pid) as process:
        process.send(signal.SIGTERM)
        assert process.exited(timeout=HANG_SECONDS)


def test_a_process_that_ignores_sigterm_is_killed_and_waited_for() -> None:
    pid = orphan("trap '' TERM; while :; do sleep 1; done")
    with watched(pid) as process:
        process.stop(grace=0)
        assert process.exited(timeout=0)


def test_a_process_that_already_exited_is_gone() -> None:
    pid = orphan("exit 0")
    with watched(pid) as process:
        assert process.exited(timeout=HANG_SECONDS)
        process.send(signal.SIGTERM)  # nothing to signal, and no error
