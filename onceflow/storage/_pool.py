"""The connection pool every activity shares within one worker process."""

import asyncio
import contextlib
import select
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool, PoolClosed


def build_pool(
    database_url: str, *, max_size: int = 10, autocommit: bool = False
) -> "OnceflowPool":
    """An unopened pool; open it with ``async with`` (psycopg never re-runs a statement).

    ``autocommit`` hands out connections in autocommit mode, for code whose every
    statement is its own transaction or inside an explicit ``transaction()`` (the
    gateway's): its ``autocommit`` blocks then have nothing to switch. Default False:
    a worker's activities rely on implicit transactions.

    Every connection is checked before it is handed out: after a PostgreSQL restart the
    pool still holds connections to the old server, and without the check each of them
    would fail one gateway request or spend one attempt of a task's budget (classified
    ``unknown``, which can park a tool). Checked, a dead connection is dropped and
    replaced, and while the server is down a caller waits for a new one and gets
    ``PoolTimeout`` (``transient``: nothing was sent). See ``_check_connection``.

    Reconnection never stops and never slows down: psycopg-pool backs it off
    exponentially without a cap (1, 3, 7, 15, 31, 63 s after the failure), and once it
    gives up (``reconnect_timeout``) nothing tries again until a caller's wait ends. Each
    chain here lasts ``RECONNECT_CHAIN`` (attempts about 1 s apart) and the next starts
    as it ends (``_reconnect_again``), so a server back after an outage of any length is
    found within about a second. Once a chain has failed, callers wait
    ``WAIT_WHILE_UNREACHABLE`` instead of the pool's 10 s (``OnceflowPool``).

    A connection always gets back to the pool, even when its caller is cancelled while
    returning it, and one the server ended while it was checked out is closed on its
    way back and replaced (``OnceflowPool.putconn``).
    """
    return OnceflowPool(
        database_url,
        min_size=1,
        max_size=max_size,
        open=False,
        timeout=10.0,
        kwargs={"connect_timeout": 5, "autocommit": autocommit},
        check=_check_connection,
        reconnect_timeout=RECONNECT_CHAIN,
    )


RECONNECT_CHAIN = 2.0
"""Seconds one chain of reconnection attempts lasts before the next starts."""

WAIT_WHILE_UNREACHABLE = 1.0
"""Seconds a caller waits for a connection once the server is known to be unreachable:
long enough for the next reconnection attempt (about a second apart) to hand it one when
the server is back, short enough that a request fails fast (503, a ``transient``
attempt) while it is down."""


class OnceflowPool(AsyncConnectionPool):
    """psycopg's pool, reconnecting without end, failing fast while its server is known
    to be unreachable, and never losing a connection to a cancelled caller."""

    def __init__(self, conninfo: str, **kwargs: Any) -> None:
        self.unreachable = False
        """A chain of reconnection attempts failed and no connection was made since."""
        self._returning: set[asyncio.Task[None]] = set()
        super().__init__(
            conninfo, configure=self._connected, reconnect_failed=self._reconnect_again, **kwargs
        )

    async def putconn(self, conn: AsyncConnection[Any]) -> None:
        """Give ``conn`` back in a task of its own, which the caller's cancellation does not
        reach.

        psycopg-pool returns a connection in the caller's task and can be cancelled while
        it waits for the pool's lock: the connection is then neither in the pool nor
        handed out, yet still counted, and never replaced. A readiness probe's timeout
        cancels its read exactly when the pool is busiest (a PostgreSQL restart under
        load); once ``max_size`` connections were lost that way the pool stayed empty and
        could not grow, and every request waited out its 10 s for good (issue #39).
        """
        returning = asyncio.ensure_future(self._give_back(conn))
        # The loop keeps only weak references to tasks: hold this one until it is done.
        self._returning.add(returning)
        returning.add_done_callback(self._returning.discard)
        await asyncio.shield(returning)

    async def _give_back(self, conn: AsyncConnection[Any]) -> None:
        # A connection checked out when the server went away shows it only by being
        # readable (psycopg hands back an idle one as it is): closed here, the pool
        # counts it as returned broken and connects a replacement at once, rather than
        # leaving it to fail the check of the next caller who draws it.
        if not conn.closed and conn.pgconn.transaction_status == TransactionStatus.IDLE:
            try:
                await _check_connection(conn)
            except Exception:
                await conn.close()
        await super().putconn(conn)

    async def getconn(self, timeout: float | None = None) -> AsyncConnection[Any]:
        if timeout is None and self.unreachable:
            timeout = WAIT_WHILE_UNREACHABLE
        return await super().getconn(timeout)

    async def _connected(self, conn: AsyncConnection[Any]) -> None:
        self.unreachable = False

    async def _reconnect_again(self, pool: AsyncConnectionPool) -> None:
        """Start the next chain of reconnection attempts (the pool grows again)."""
        self.unreachable = True
        with contextlib.suppress(PoolClosed):
            await self.check()


async def _check_connection(conn: AsyncConnection[Any]) -> None:
    """Raise if ``conn`` is unusable, with a round trip only when it may be.

    A server that stops or terminates its sessions (a restart, ``pg_terminate_backend``)
    sends the session a FATAL message and closes the socket, so an idle connection it
    has ended is readable; one it has not ended has nothing to read. The empty statement
    that settles it runs only then, not on every checkout (it was a fifth of a replayed
    request's time in the gateway). A host gone without a word is found by the statement
    that uses the connection, as it was by the round-trip check.
    """
    if conn.closed:
        raise psycopg.OperationalError("the connection is closed")
    readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    if readable:
        await AsyncConnectionPool.check_connection(conn)


@asynccontextmanager
async def autocommit(conn: AsyncConnection[Any]) -> AsyncIterator[None]:
    """Run single statements on a pooled connection as their own transactions: one round
    trip each instead of three (BEGIN, the statement, COMMIT). The pool's connections are
    shared with code that relies on implicit transactions, so the mode is put back; on a
    connection already in autocommit (``build_pool(autocommit=True)``) nothing is
    switched, which spares each statement two waits for the connection's lock."""
    if conn.autocommit:
        yield
        return
    await conn.set_autocommit(True)
    try:
        yield
    finally:
        try:
            await conn.set_autocommit(False)
        except Exception:
            # Still running a statement (cancelled) or broken: a connection that kept the
            # mode must never serve other code, so it is closed and the pool drops it.
            await conn.close()
