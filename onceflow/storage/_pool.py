"""The connection pool every activity shares within one worker process."""

from psycopg_pool import AsyncConnectionPool


def build_pool(database_url: str, *, max_size: int = 10) -> AsyncConnectionPool:
    """An unopened pool; open it with ``async with`` (psycopg never re-runs a statement).

    Every connection is checked (an empty statement, one round trip) before it is handed
    out: after a PostgreSQL restart the pool still holds connections to the old server,
    and without the check each of them would fail one gateway request or spend one
    attempt of a task's budget (classified ``unknown``, which can park a tool). Checked,
    a dead connection is dropped and replaced, and while the server is down a caller
    waits for a new one and gets ``PoolTimeout`` (``transient``: nothing was sent).

    ``reconnect_timeout`` equals the wait: psycopg-pool backs reconnection off
    exponentially without a cap (1, 3, 7, 15, 31, 63 s after the failure), so a server
    back after 32 s would be found only at 63 s. Giving up after 10 s ends that chain,
    and the next caller starts a new one at once: the pool finds a restarted server
    within seconds, and a task's attempts (one pool wait each) cover the outage.
    """
    return AsyncConnectionPool(
        database_url,
        min_size=1,
        max_size=max_size,
        open=False,
        timeout=10.0,
        kwargs={"connect_timeout": 5},
        check=AsyncConnectionPool.check_connection,
        reconnect_timeout=10.0,
    )
