"""``autocommit``: the idempotency store and the principals run single statements in
autocommit on connections they borrow from a pool shared with code that relies on
implicit transactions: every connection must go back in the mode it was found in, or the
pool must drop it."""

import asyncio

import psycopg

from onceflow.storage import autocommit
from tests.harness import eventually


async def test_a_statement_cancelled_in_autocommit_never_leaves_the_mode_on(database: str) -> None:
    async with await psycopg.AsyncConnection.connect(database) as conn:
        backend = conn.info.backend_pid

        async def sleep_in_autocommit() -> None:
            async with autocommit(conn):
                await conn.execute("SELECT pg_sleep(30)")

        running = asyncio.create_task(sleep_in_autocommit())

        async def running_statement() -> bool:
            async with await psycopg.AsyncConnection.connect(database, autocommit=True) as probe:
                cursor = await probe.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND state = 'active'",
                    (backend,),
                )
                return await cursor.fetchone() is not None

        await eventually(running_statement, what="the statement runs")
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)

        # psycopg cancels the statement and waits for the server, so the mode is put
        # back; a connection that could not be put back would be closed instead.
        assert conn.closed or not conn.autocommit
        assert conn.closed or (await (await conn.execute("SELECT 1")).fetchone()) == (1,)


async def test_a_statement_in_autocommit_leaves_its_connection_as_it_was(database: str) -> None:
    async with await psycopg.AsyncConnection.connect(database) as conn:
        async with autocommit(conn):
            await conn.execute("SELECT 1")
            assert conn.autocommit

        assert not conn.autocommit
        assert not conn.closed


async def test_a_connection_already_in_autocommit_is_left_in_it(database: str) -> None:
    # The gateway's pool hands out such connections: nothing to switch, nothing to put back.
    async with await psycopg.AsyncConnection.connect(database, autocommit=True) as conn:
        async with autocommit(conn):
            await conn.execute("SELECT 1")

        assert conn.autocommit
        assert not conn.closed
