"""The connection pool every activity shares within one worker process."""

from psycopg_pool import AsyncConnectionPool


def build_pool(database_url: str, *, max_size: int = 10) -> AsyncConnectionPool:
    """An unopened pool; open it with ``async with`` (psycopg never re-runs a statement)."""
    return AsyncConnectionPool(
        database_url,
        min_size=1,
        max_size=max_size,
        open=False,
        timeout=10.0,
        kwargs={"connect_timeout": 5},
    )
