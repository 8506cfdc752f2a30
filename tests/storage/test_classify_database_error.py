"""Database failures are classified once, for every tool: what could have committed?"""

import psycopg
import pytest

from onceflow.retry_policy import OutcomeClass
from onceflow.storage import classify_database_error


async def test_a_database_constraint_violation_is_a_rejected_outcome(database: str) -> None:
    with psycopg.connect(database) as conn, pytest.raises(psycopg.IntegrityError) as violation:
        conn.execute(
            "INSERT INTO order_lines (order_id, line_no, sku, quantity, unit_price_cents)"
            " VALUES (gen_random_uuid(), 1, 'x', 0, 1)"
        )
    assert classify_database_error(violation.value)[0] is OutcomeClass.REJECTED


async def test_a_lost_connection_is_an_unknown_outcome() -> None:
    broken = psycopg.OperationalError("server closed the connection unexpectedly")
    assert classify_database_error(broken)[0] is OutcomeClass.UNKNOWN


async def test_a_serialization_failure_is_transient(database: str) -> None:
    with psycopg.connect(database, autocommit=True) as setup:
        setup.execute("CREATE TABLE IF NOT EXISTS serial_probe (id int PRIMARY KEY, n int)")
        setup.execute("INSERT INTO serial_probe VALUES (1, 0) ON CONFLICT DO NOTHING")
    with psycopg.connect(database) as a, psycopg.connect(database) as b:
        a.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        b.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        a.execute("SELECT n FROM serial_probe WHERE id = 1").fetchone()
        b.execute("SELECT n FROM serial_probe WHERE id = 1").fetchone()
        a.execute("UPDATE serial_probe SET n = n + 1 WHERE id = 1")
        a.commit()
        with pytest.raises(psycopg.errors.SerializationFailure) as conflict:
            b.execute("UPDATE serial_probe SET n = n + 1 WHERE id = 1")
    assert classify_database_error(conflict.value)[0] is OutcomeClass.TRANSIENT
