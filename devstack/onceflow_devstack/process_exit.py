"""Waiting for a process the stack did not start itself to exit: the PostgreSQL server
(``pg_ctl`` starts it) and a Temporal dev server a crashed stack left behind.

Neither is a child of the stack, so ``waitpid`` cannot wait for it. Where the platform
has ``pidfd_open`` (Linux), the wait is on the process's file descriptor, which becomes
readable the moment it exits; elsewhere the pid is probed at a polling cadence. Either
way an exited process counts as gone even while it waits, a zombie, for a parent that
does not reap it (a container's init that never does keeps every orphan's pid taken).
"""

import contextlib
import os
import select
import signal
import time
from collections.abc import Iterator
from pathlib import Path

_PROBE_EVERY = 0.05
"""Seconds between probes where there is no pidfd: a polling cadence, not a guess."""


class ProcessDidNotExit(RuntimeError):
    """A process was still running after it was killed and waited for."""


@contextlib.contextmanager
def watched(pid: int) -> Iterator["WatchedProcess"]:
    """Hold on to process ``pid`` for the block, so a signal or a wait reaches that
    process and never one that got its pid after it exited."""
    watch = WatchedProcess(pid)
    try:
        yield watch
    finally:
        watch.close()


class WatchedProcess:
    """One process, signalled and waited for by its pidfd where there is one."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._descriptor: int | None = None
        self._gone = False
        if hasattr(os, "pidfd_open"):
            try:
                self._descriptor = os.pidfd_open(pid)
            except ProcessLookupError:
                self._gone = True

    def send(self, number: signal.Signals) -> None:
        """Send signal ``number``; nothing when the process has already exited."""
        if self._gone:
            return
        with contextlib.suppress(ProcessLookupError):
            if self._descriptor is not None:
                signal.pidfd_send_signal(self._descriptor, number)
            else:
                os.kill(self.pid, number)

    def exited(self, *, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the process to exit; whether it has."""
        if self._gone:
            return True
        if self._descriptor is not None:
            readable, _, _ = select.select([self._descriptor], [], [], timeout)
            self._gone = bool(readable)
            return self._gone
        deadline = time.monotonic() + timeout
        while _running(self.pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(_PROBE_EVERY)
        self._gone = True
        return True

    def stop(self, *, grace: float) -> None:
        """SIGTERM, up to ``grace`` seconds to exit, then SIGKILL; returns once it exited.

        Raises:
            ProcessDidNotExit: Still running a minute after SIGKILL (stuck in the kernel).
        """
        self.send(signal.SIGTERM)
        if self.exited(timeout=grace):
            return
        self.send(signal.SIGKILL)
        if not self.exited(timeout=60):
            raise ProcessDidNotExit(f"process {self.pid} did not exit after SIGKILL")

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    status = Path(f"/proc/{pid}/status")
    with contextlib.suppress(OSError):
        return "State:\tZ" not in status.read_text()
    return True
