"""``apply_migrations`` and ``onceflow migrate`` say where the schema stands, and a number no
migration holds is named with its reason, never left to look like a failed migration."""

import os
import subprocess
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from onceflow.storage import RETIRED_MIGRATIONS, apply_migrations
from onceflow.storage._schema import MIGRATIONS
from tests.harness import REPO, onceflow_command

VERSIONS = [version for version, _, _ in MIGRATIONS]
LATEST = max(VERSIONS)


@pytest.fixture
def fresh_database(postgres_url: str) -> Iterator[str]:
    """An empty database on the session's server, dropped afterwards."""
    name = f"migrate_{uuid.uuid4().hex[:10]}"
    admin = make_conninfo(postgres_url, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield make_conninfo(postgres_url, dbname=name)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_every_gap_in_the_numbering_is_a_retired_migration() -> None:
    assert VERSIONS == sorted(VERSIONS)
    assert not set(VERSIONS) & set(RETIRED_MIGRATIONS)
    assert sorted([*VERSIONS, *RETIRED_MIGRATIONS]) == list(range(1, LATEST + 1))


async def test_the_status_names_what_was_applied_the_version_and_the_retired_number(
    fresh_database: str,
) -> None:
    first = await apply_migrations(fresh_database)
    assert first.applied_now == tuple(VERSIONS)
    assert first.version == LATEST
    described = first.describe()
    assert described.startswith(
        f"applied migrations 1, 2, 4–{LATEST}; the database is at schema version {LATEST}, "
        "up to date"
    )
    assert "there is no migration 3: it was retired before any release" in described

    again = await apply_migrations(fresh_database)
    assert again.applied_now == ()
    assert again.applied == tuple(VERSIONS)
    assert again.describe().startswith(
        f"nothing to apply; the database is at schema version {LATEST}, up to date (there is "
        "no migration 3:"
    )


async def test_a_migration_from_a_newer_onceflow_is_named(fresh_database: str) -> None:
    await apply_migrations(fresh_database)
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO schema_migrations (version, description) VALUES (%s, 'newer')",
            (LATEST + 1,),
        )
    status = await apply_migrations(fresh_database)
    assert status.unknown == (LATEST + 1,)
    assert (
        f"it also records migrations {LATEST + 1}, which this onceflow does not have"
        in status.describe()
    )


def test_the_migrate_command_prints_the_schema_version_on_one_line(fresh_database: str) -> None:
    ran = subprocess.run(
        onceflow_command("migrate"),
        cwd=REPO,
        env={**os.environ, "DATABASE_URL": fresh_database},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    [line] = ran.stdout.strip().splitlines()
    assert line.startswith(f"applied migrations 1, 2, 4–{LATEST}; the database is at schema")
    assert "there is no migration 3" in line
    with psycopg.connect(fresh_database) as conn:
        recorded = conn.execute("SELECT version FROM schema_migrations ORDER BY version")
        assert [version for (version,) in recorded.fetchall()] == VERSIONS
