"""The PostgreSQL activities on their own: repeats, constraints and failure classification."""

import uuid

import psycopg
import pytest
from temporalio.testing import ActivityEnvironment

from onceflow.activities import CouponActivities, OrderActivities
from onceflow.retry_policy import OutcomeClass
from onceflow.storage import build_pool, classify_database_error
from onceflow.tools import ToolCallInput


def call(
    tool: str, arguments: dict[str, object], *, workflow_id: str = "wf-1", step_id: str = "s"
) -> ToolCallInput:
    return ToolCallInput(
        tenant="acme",
        principal="agent",
        workflow_id=workflow_id,
        step_id=step_id,
        tool=tool,
        arguments=arguments,
        attempt=1,
    )


async def test_a_repeated_create_order_attempt_returns_the_first_order(database: str) -> None:
    arguments = {
        "customer_id": "c-9",
        "currency": "eur",
        "lines": [{"sku": "book", "quantity": 2, "unit_price_cents": 2000}],
    }
    async with build_pool(database) as pool:
        orders = OrderActivities(pool)
        env = ActivityEnvironment()
        first = await env.run(orders.create_order, call("create_order", arguments))
        repeat = await env.run(orders.create_order, call("create_order", arguments))
        other_step = await env.run(
            orders.create_order, call("create_order", arguments, step_id="t")
        )

    assert first.outcome is repeat.outcome is OutcomeClass.SUCCEEDED
    assert repeat.resource_id == first.resource_id
    assert (first.result["replayed"], repeat.result["replayed"]) == (False, True)
    assert other_step.resource_id != first.resource_id
    assert first.evidence["child_key_digest"].startswith("sha256:")
    with psycopg.connect(database) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (2,)
        assert conn.execute(
            "SELECT state, resource_id FROM operations"
            " WHERE tool = 'create_order' ORDER BY created_at"
        ).fetchall() == [("succeeded", first.resource_id), ("succeeded", other_step.resource_id)]


async def test_issue_coupon_reports_an_existing_issuance_instead_of_a_second_row(
    database: str,
) -> None:
    user = f"u-{uuid.uuid4().hex[:6]}"
    arguments = {"user_id": user, "coupon_id": "VIP"}
    async with build_pool(database) as pool:
        coupons = CouponActivities(pool)
        env = ActivityEnvironment()
        mine = await env.run(coupons.issue_coupon, call("issue_coupon", arguments))
        my_repeat = await env.run(coupons.issue_coupon, call("issue_coupon", arguments))
        theirs = await env.run(
            coupons.issue_coupon, call("issue_coupon", arguments, workflow_id="wf-2")
        )

    assert mine.result["already_issued"] is False
    assert my_repeat.result["already_issued"] is False  # our own earlier attempt
    assert theirs.result["already_issued"] is True
    assert mine.resource_id == my_repeat.resource_id == theirs.resource_id
    with psycopg.connect(database) as conn:
        assert conn.execute(
            "SELECT count(*) FROM coupon_issuances WHERE user_id = %s", (user,)
        ).fetchone() == (1,)


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
