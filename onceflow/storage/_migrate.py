"""Applies pending migrations once, even with several processes starting together, and says
where the schema stands afterwards.

Migration numbers are never reused or shifted: ``schema_migrations`` records the numbers a
database has applied, so renumbering would make a migrated database re-run (and fail on)
a migration it already has. A number no migration holds is listed in ``RETIRED_MIGRATIONS``
with the reason, and the report names it, so a gap never reads as a failed migration.
"""

from dataclasses import dataclass

import psycopg

from onceflow.storage._schema import MIGRATIONS

# Any constant works; it only has to be the same in every onceflow process.
_MIGRATION_LOCK = 0x0_6E_CE_F1_0

RETIRED_MIGRATIONS: dict[int, str] = {
    3: "it was retired before any release, so no database has it",
}
"""Numbers no migration holds, and why; no database has ever applied them."""


@dataclass(frozen=True)
class SchemaStatus:
    """Where a database's schema stands after ``apply_migrations``."""

    applied_now: tuple[int, ...]
    """The migrations this call applied, in order (empty when it was up to date)."""
    applied: tuple[int, ...]
    """Every migration the database records, in order, ``applied_now`` included."""

    @property
    def version(self) -> int:
        """The schema version: the highest migration applied (0 for none)."""
        return max(self.applied, default=0)

    @property
    def unknown(self) -> tuple[int, ...]:
        """Migrations the database records that this onceflow does not have (a newer one
        migrated it)."""
        known = {version for version, _, _ in MIGRATIONS}
        return tuple(version for version in self.applied if version not in known)

    def describe(self) -> str:
        """One line for an operator: what was applied, the version, and why a number is
        missing."""
        if self.applied_now:
            done = f"applied migrations {_spans(self.applied_now)}"
        else:
            done = "nothing to apply"
        line = f"{done}; the database is at schema version {self.version}, up to date"
        retired = [
            f"there is no migration {version}: {why}"
            for version, why in sorted(RETIRED_MIGRATIONS.items())
            if version < self.version
        ]
        if retired:
            line += f" ({'; '.join(retired)})"
        if self.unknown:
            line += (
                f"; it also records migrations {_spans(self.unknown)}, which this onceflow "
                "does not have (a newer onceflow migrated it)"
            )
        return line


async def apply_migrations(database_url: str) -> SchemaStatus:
    """Bring the schema up to date; returns where it stands (and what was applied now)."""
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
    return SchemaStatus(
        applied_now=tuple(applied_now), applied=tuple(sorted(done.union(applied_now)))
    )


def _spans(versions: tuple[int, ...]) -> str:
    """``1, 2, 4–8``: runs of three or more consecutive numbers as a range."""
    runs: list[list[int]] = []
    for version in sorted(versions):
        if runs and version == runs[-1][-1] + 1:
            runs[-1].append(version)
        else:
            runs.append([version])
    return ", ".join(
        f"{run[0]}–{run[-1]}" if len(run) > 2 else ", ".join(str(number) for number in run)
        for run in runs
    )
