"""The two PostgreSQL tools under concurrency, on the real dev server and database."""

import asyncio
import uuid

import psycopg
from temporalio.testing import WorkflowEnvironment

from onceflow.task_api import TaskClient
from onceflow.tools.worker import derive_task_workflow_id
from onceflow.workflows.task_models import AgentTaskInput, StepInput, StepState, TaskState

from .conftest import WorkerFactory


def coupon_task(principal: str, user: str) -> AgentTaskInput:
    return AgentTaskInput(
        tenant="acme",
        principal=principal,
        steps=[
            StepInput(
                step_id="coupon",
                tool="issue_coupon",
                arguments={"user_id": user, "coupon_id": "SPRING25"},
            )
        ],
    )


async def test_twenty_concurrent_coupon_tasks_from_two_workers_issue_one_coupon(
    dev_server: WorkflowEnvironment, database: str, task_queue: str, worker_processes: WorkerFactory
) -> None:
    first, second = worker_processes(), worker_processes()
    client = TaskClient(dev_server.client, task_queue=task_queue)
    user = f"u-{uuid.uuid4().hex[:8]}"
    ids = [f"coupon-race-{uuid.uuid4().hex}" for _ in range(20)]

    await asyncio.gather(
        *(client.start(coupon_task(f"agent-{n}", user), workflow_id=i) for n, i in enumerate(ids))
    )
    results = await asyncio.gather(*(client.result(i) for i in ids))

    with psycopg.connect(database) as conn:
        rows = conn.execute(
            "SELECT issuance_id, workflow_id FROM coupon_issuances WHERE user_id = %s", (user,)
        ).fetchall()
    assert len(rows) == 1
    [(issuance_id, winner)] = rows
    assert all(result.state is TaskState.SUCCEEDED for result in results)
    assert {result.step("coupon").resource_id for result in results} == {str(issuance_id)}
    fresh = [r for r in results if r.step("coupon").result["already_issued"] is False]
    assert [r.workflow_id for r in fresh] == [winner]
    # Both processes did work: the race really crossed process boundaries.
    workflow_pids = set()
    for workflow_id in ids:
        history = await dev_server.client.get_workflow_handle(workflow_id).fetch_history()
        workflow_pids |= {
            event.activity_task_started_event_attributes.identity.split("@")[0]
            for event in history.events
            if event.HasField("activity_task_started_event_attributes")
        }
    assert workflow_pids == {str(first.pid), str(second.pid)}


async def test_create_order_called_twice_with_the_same_key_leaves_one_order(
    dev_server: WorkflowEnvironment, database: str, task_queue: str, worker_processes: WorkerFactory
) -> None:
    worker_processes()
    client = TaskClient(dev_server.client, task_queue=task_queue)
    customer = f"c-{uuid.uuid4().hex[:8]}"
    order = AgentTaskInput(
        tenant="acme",
        principal="agent",
        steps=[
            StepInput(
                step_id="1",
                tool="create_order",
                arguments={
                    "customer_id": customer,
                    "currency": "usd",
                    "lines": [
                        {"sku": "tee-black", "quantity": 3, "unit_price_cents": 1500},
                        {"sku": "cap", "quantity": 1, "unit_price_cents": 900},
                    ],
                },
            )
        ],
    )
    workflow_id = derive_task_workflow_id(
        tenant="acme", scope="create_order", idempotency_key="k-1"
    )

    await asyncio.gather(*(client.start(order, workflow_id=workflow_id) for _ in range(2)))
    first = await client.result(workflow_id)
    await client.start(order, workflow_id=workflow_id)  # a late retry after completion
    second = await client.result(workflow_id)

    with psycopg.connect(database) as conn:
        orders = conn.execute(
            "SELECT order_id, total_cents FROM orders WHERE customer_id = %s", (customer,)
        ).fetchall()
        lines = conn.execute(
            "SELECT count(*) FROM order_lines WHERE order_id = %s", (orders[0][0],)
        ).fetchone()
    assert len(orders) == 1
    assert orders[0][1] == 3 * 1500 + 900
    assert lines == (2,)
    assert first.step("1").state is StepState.SUCCEEDED
    assert first.step("1").resource_id == second.step("1").resource_id == str(orders[0][0])
    assert sum(len(step.attempts) for step in second.steps) == 1
