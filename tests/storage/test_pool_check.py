"""The pool's check before a checkout: a round trip only for a connection the server may
have ended, and a connection it ended is replaced before anyone uses it."""

import select
import socket
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from onceflow.storage import build_pool
from onceflow.storage._pool import WAIT_WHILE_UNREACHABLE
from tests.gateway.outages import database_proxy
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


async def test_reconnection_goes_on_at_the_same_pace_while_the_server_stays_down() -> None:
    # Nothing listens: every attempt is refused at once. psycopg-pool alone backs off
    # exponentially and gives up (1, 3, 7, 10 s: five attempts, then silence until a
    # caller's wait ends); the pool keeps trying about every second, so a server that
    # comes back after any outage is found within about a second.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with build_pool(f"postgresql://onceflow@127.0.0.1:{port}/onceflow") as pool:

        def attempts() -> int:
            return int(pool.get_stats().get("connections_errors", 0))

        await eventually(
            attempts,
            until=lambda failed: failed >= 8,
            what="eight refused connection attempts (more than one backed-off chain makes)",
        )


async def test_callers_fail_fast_while_the_server_is_unreachable_and_wait_again_once_it_is_back(
    database: str,
) -> None:
    # The pool's address answers nothing at first (the server is down), then relays to
    # the real server (it is back).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    down_url = make_conninfo(database, host="127.0.0.1", port=port)
    async with build_pool(down_url) as pool:
        await eventually(lambda: pool.unreachable, what="a failed chain of reconnection attempts")
        # A caller waits the short time, not the pool's 10 s, and gets PoolTimeout.
        with pytest.raises(PoolTimeout, match=f"after {WAIT_WHILE_UNREACHABLE:.2f} sec"):
            async with pool.connection():
                pass
        relay = database_proxy(database)
        await relay.start(port)
        try:
            await eventually(lambda: not pool.unreachable, what="a connection through the relay")
            async with pool.connection() as conn:
                assert await (await conn.execute("SELECT 1")).fetchone() == (1,)
        finally:
            await relay.stop()
