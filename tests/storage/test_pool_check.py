"""The pool's check before a checkout: a round trip only for a connection the server may
have ended, and a connection it ended is replaced before anyone uses it."""

import select
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from onceflow.storage import build_pool
from tests.harness import eventually


@pytest.fixture
def round_trip_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Backend pids of the connections psycopg's round-trip check ran on."""
    checked: list[int] = []
    round_trip = AsyncConnectionPool.check_connection

    async def counted(conn: psycopg.AsyncConnection[Any]) -> None:
        checked.append(conn.info.backend_pid)
        await round_trip(conn)

    monkeypatch.setattr(AsyncConnectionPool, "check_connection", counted)
    return checked


async def test_a_healthy_connection_is_handed_out_without_a_round_trip(
    database: str, round_trip_checks: list[int]
) -> None:
    async with build_pool(database, max_size=1) as pool:
        for _ in range(3):
            async with pool.connection() as conn:
                assert await (await conn.execute("SELECT 1")).fetchone() == (1,)
    assert round_trip_checks == []


async def test_a_connection_the_server_ended_is_replaced_before_it_is_used(
    database: str, round_trip_checks: list[int]
) -> None:
    async with build_pool(database, max_size=1) as pool:
        async with pool.connection() as conn:
            ended = conn.info.backend_pid
            socket = conn.pgconn.socket
        async with await psycopg.AsyncConnection.connect(database, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (ended,))

        async def farewell_arrived() -> bool:
            return bool(select.select([socket], [], [], 0)[0])

        await eventually(farewell_arrived, what="the server's FATAL message and close")

        async with pool.connection() as conn:
            # The first statement on the handed-out connection succeeds.
            assert await (await conn.execute("SELECT pg_backend_pid()")).fetchone() != (ended,)
    assert round_trip_checks == [ended]
