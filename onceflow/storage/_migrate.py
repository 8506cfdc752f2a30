"""Applies pending migrations once, even with several processes starting together."""

import psycopg

from onceflow.storage._schema import MIGRATIONS

# Any constant works; it only has to be the same in every onceflow process.
_MIGRATION_LOCK = 0x0_6E_CE_F1_0


async def apply_migrations(database_url: str) -> list[int]:
    """Bring the schema up to date; returns the versions applied now (empty if none)."""
    applied_now: list[int] = []
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
        try:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version integer PRIMARY KEY, description text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            cursor = await conn.execute("SELECT version FROM schema_migrations")
            done = {row[0] for row in await cursor.fetchall()}
            for version, description, sql in MIGRATIONS:
                if version in done:
                    continue
                async with conn.transaction():
                    await conn.execute(sql.encode())
                    await conn.execute(
                        "INSERT INTO schema_migrations (version, description) VALUES (%s, %s)",
                        (version, description),
                    )
                applied_now.append(version)
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))
    return applied_now
