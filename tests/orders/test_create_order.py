"""``create_order`` on its own against PostgreSQL: the order and its record commit together,
a repeat of the step, or the same order asked by another step, returns the first order, a
race of two attempts makes one."""

import asyncio

import psycopg

from onceflow.orders import order_tools
from onceflow.retry_policy import OutcomeClass
from onceflow.storage import build_pool
from onceflow.tools.worker import ToolCallInput, tool_activities
from tests.harness import attempt_environment

ARGUMENTS = {
    "customer_id": "c-9",
    "currency": "eur",
    "lines": [{"sku": "book", "quantity": 2, "unit_price_cents": 2000}],
}


def call(
    arguments: dict[str, object], *, workflow_id: str = "wf-1", step_id: str = "s"
) -> ToolCallInput:
    return ToolCallInput(
        tenant="acme",
        principal="agent",
        workflow_id=workflow_id,
        step_id=step_id,
        tool="create_order",
        arguments=arguments,
        attempt=1,
        policy=order_tools()[0].registered_contract.policy(),
    )


async def test_a_repeated_create_order_attempt_returns_the_first_order(database: str) -> None:
    [create_order] = order_tools()
    async with build_pool(database) as pool:
        [perform] = tool_activities(create_order, pool, None)
        env = attempt_environment()
        first = await env.run(perform, call(ARGUMENTS))
        repeat = await env.run(perform, call(ARGUMENTS))
        # The same order asked by another step (another task, key or surface alike) is
        # the same intent: answered by the first, nothing written.
        other_step = await env.run(perform, call(ARGUMENTS, workflow_id="wf-2"))
        # A second identical order on purpose is a deliberate repeat.
        deliberate = await env.run(
            perform,
            call(ARGUMENTS, workflow_id="wf-3").model_copy(update={"deliberate_repeat": True}),
        )

    assert first.outcome is repeat.outcome is other_step.outcome is OutcomeClass.SUCCEEDED
    assert repeat.resource_id == first.resource_id
    assert (first.result["replayed"], repeat.result["replayed"]) == (False, True)
    assert other_step.resource_id == first.resource_id
    assert other_step.result["repeat_of"] == {"task_id": "wf-1", "step_id": "s"}
    assert deliberate.resource_id not in (None, first.resource_id)
    assert first.evidence["child_key_digest"].startswith("sha256:")
    with psycopg.connect(database) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (2,)
        assert conn.execute(
            "SELECT state, resource_id FROM operations"
            " WHERE tool = 'create_order' ORDER BY created_at"
        ).fetchall() == [("succeeded", first.resource_id), ("succeeded", deliberate.resource_id)]


async def test_two_attempts_racing_make_one_order_and_report_the_same_one(database: str) -> None:
    [create_order] = order_tools()
    async with build_pool(database) as pool:
        [perform] = tool_activities(create_order, pool, None)
        results = await asyncio.gather(
            *(attempt_environment().run(perform, call(ARGUMENTS)) for _ in range(4))
        )

    assert {result.outcome for result in results} == {OutcomeClass.SUCCEEDED}
    assert len({result.resource_id for result in results}) == 1
    assert sorted(result.result["replayed"] for result in results) == [False, True, True, True]
    with psycopg.connect(database) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM order_lines").fetchone() == (1,)


async def test_an_order_the_database_refuses_is_rejected_and_leaves_nothing(database: str) -> None:
    [create_order] = order_tools()
    async with build_pool(database) as pool:
        [perform] = tool_activities(create_order, pool, None)
        # Valid input never breaks the tables' rules: add one it breaks, for this test.
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute("ALTER TABLE orders ADD CONSTRAINT probe_small CHECK (total_cents < 10)")
        try:
            refused = await attempt_environment().run(perform, call(ARGUMENTS))
        finally:
            with psycopg.connect(database, autocommit=True) as conn:
                conn.execute("ALTER TABLE orders DROP CONSTRAINT probe_small")

    assert refused.outcome is OutcomeClass.REJECTED
    assert "the database refused the write" in (refused.reason or "")
    with psycopg.connect(database) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (0,)
        assert conn.execute("SELECT state FROM operations").fetchall() == [("failed",)]
