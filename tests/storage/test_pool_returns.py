"""A connection always gets back to the pool: a caller cancelled while returning it
loses nothing, and one the server ended while it was out is replaced on its way back."""

import asyncio
import random
from typing import Any

import psycopg

from onceflow.storage import build_pool

POOL_SIZE = 4
CALLERS = 40
"""Callers at once, ten per connection: returns queue for the pool's lock."""
ROUNDS = 150
"""Reads each caller starts and cancels (about 6000 in all)."""


async def test_callers_cancelled_at_any_point_lose_no_connection(database: str) -> None:
    """Readiness probes time out (``asyncio.wait_for``) at any point of their read: while
    waiting for a connection, during the statement, or while giving it back. Afterwards
    the pool still has every one of its connections to hand out."""
    rng = random.Random(39)
    async with build_pool(database, max_size=POOL_SIZE, autocommit=True) as pool:

        async def read() -> None:
            async with pool.connection() as conn:
                await conn.execute("SELECT 1")

        async def caller() -> None:
            for _ in range(ROUNDS):
                # Timeouts from under a millisecond to a whole read: some land while
                # the connection is handed back and the pool's lock is contended.
                try:
                    await asyncio.wait_for(read(), rng.uniform(0.0005, 0.02))
                except TimeoutError:
                    pass

        await asyncio.gather(*(caller() for _ in range(CALLERS)))

        held = [await pool.getconn(timeout=10) for _ in range(POOL_SIZE)]
        assert len({conn.info.backend_pid for conn in held}) == POOL_SIZE
        for conn in held:
            await pool.putconn(conn)


async def test_a_connection_the_server_ended_while_it_was_out_is_replaced_on_return(
    database: str,
) -> None:
    async with build_pool(database, max_size=1, autocommit=True) as pool:
        conn = await pool.getconn()
        ended = conn.info.backend_pid
        async with await psycopg.AsyncConnection.connect(database, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (ended,))
        await _until_readable(conn)
        await pool.putconn(conn)

        assert conn.closed
        assert pool.get_stats().get("returns_bad") == 1
        async with pool.connection() as fresh:
            row = await (await fresh.execute("SELECT pg_backend_pid()")).fetchone()
        assert row is not None and row[0] != ended


async def _until_readable(conn: psycopg.AsyncConnection[Any]) -> None:
    """Wait for the server's goodbye (its FATAL message and the socket's end)."""
    readable = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(conn.pgconn.socket, readable.set)
    try:
        await readable.wait()
    finally:
        loop.remove_reader(conn.pgconn.socket)
