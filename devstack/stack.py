"""The embedded stack behind ``onceflow dev`` and ``onceflow demo``.

PostgreSQL (or ``DATABASE_URL``), schema migrations, the Temporal dev server with the
Web UI, and one worker, all under one state folder. A lock file held for the stack's
life makes a second concurrent stack refuse clearly; the operating system releases it
when a stack dies, so a crashed run never blocks the next.
"""

import asyncio
import fcntl
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from devstack.postgres import EmbeddedPostgres
from devstack.temporal import TemporalDevServer
from settings import OnceflowSettings
from storage import apply_migrations
from worker import serve_worker


class StackAlreadyRunning(RuntimeError):
    """Another embedded stack holds this state folder."""


@dataclass(frozen=True)
class StackInfo:
    """What runs where."""

    state_dir: Path
    database_url: str
    database_is_embedded: bool
    temporal_address: str
    ui_url: str
    task_queue: str

    def describe(self) -> list[tuple[str, str]]:
        """(what, where) pairs for printing."""
        database = "embedded PostgreSQL" if self.database_is_embedded else "PostgreSQL (DATABASE_URL)"
        return [
            ("Temporal (gRPC)", self.temporal_address),
            ("Temporal Web UI", self.ui_url),
            (database, _without_password(self.database_url)),
            ("worker task queue", self.task_queue),
            ("state and logs", str(self.state_dir)),
        ]


def running_stack_database_url(state_dir: Path) -> str | None:
    """The database URL a running (or last) embedded stack recorded, if any."""
    recorded = state_dir / "database_url"
    return recorded.read_text().strip() if recorded.exists() else None


@asynccontextmanager
async def embedded_stack(
    settings: OnceflowSettings,
    *,
    temporal_port: int = 7233,
    ui_port: int = 8233,
    progress: Callable[[str], None] = lambda message: None,
) -> AsyncIterator[StackInfo]:
    """Run the whole stack for the duration of the block, then stop it in order."""
    state_dir = settings.state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive(state_dir / "dev.lock"):
        postgres: EmbeddedPostgres | None = None
        temporal = TemporalDevServer(state_dir, port=temporal_port, ui_port=ui_port)
        stop_worker = asyncio.Event()
        worker_task: asyncio.Task[None] | None = None
        try:
            if settings.database_url:
                database_url = settings.database_url
            else:
                progress("starting PostgreSQL")
                postgres = EmbeddedPostgres(state_dir / "postgres")
                database_url = postgres.url
            (state_dir / "database_url").write_text(database_url)
            progress("applying migrations")
            await apply_migrations(database_url)
            progress("starting the Temporal dev server")
            endpoints = await temporal.start()
            progress("starting a worker")
            ready = asyncio.Event()
            worker_task = asyncio.create_task(
                serve_worker(
                    settings,
                    database_url=database_url,
                    stop=stop_worker,
                    temporal_address=endpoints.address,
                    on_ready=ready.set,
                )
            )
            await _wait_until_ready(ready, worker_task)
            yield StackInfo(
                state_dir=state_dir,
                database_url=database_url,
                database_is_embedded=postgres is not None,
                temporal_address=endpoints.address,
                ui_url=endpoints.ui_url,
                task_queue=settings.task_queue,
            )
        finally:
            progress("stopping")
            stop_worker.set()
            if worker_task is not None:
                await asyncio.gather(worker_task, return_exceptions=True)
            temporal.stop()
            if postgres is not None:
                postgres.stop()


async def _wait_until_ready(ready: asyncio.Event, worker_task: "asyncio.Task[None]") -> None:
    ready_wait = asyncio.create_task(ready.wait())
    done, _ = await asyncio.wait({ready_wait, worker_task}, return_when=asyncio.FIRST_COMPLETED)
    if worker_task in done:
        ready_wait.cancel()
        worker_task.result()  # re-raises why the worker could not start
        raise RuntimeError("the worker stopped before it was ready")


@contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path``; refuse at once when another process holds it."""
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise StackAlreadyRunning(
                f"an embedded stack is already running from {path.parent} (pid {holder}); "
                "use it, or stop it with Ctrl-C in its terminal"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url
