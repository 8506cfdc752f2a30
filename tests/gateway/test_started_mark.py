"""When a plan task's record is marked started, and what the upkeep pass does for a claim
whose owner died before marking it.

A task that ends within ``MARK_STARTED_AFTER`` is marked by its outcome's write (one
statement after the claim); one that runs longer is marked while its starter still waits.
"""

import asyncio
import uuid
from dataclasses import replace

import pytest
from temporalio.service import RPCError

from onceflow.gateway import _task_starts
from onceflow.settings import OnceflowSettings
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient
from onceflow.worker import build_worker
from onceflow.workflows.pruning import PruneIdempotencyRecordsWorkflow
from onceflow.workflows.pruning_models import PruneInput, PruneResult
from onceflow.workflows.task_models import ApproveInput, TaskState
from tests.harness import eventually
from tests.tool_configuration import builtin

from .conftest import Caller, Stack, count, execute, make_caller, new_tenant, open_service, rows

ORDER = {
    "customer_id": "c-mark",
    "currency": "eur",
    "lines": [{"sku": "mug", "quantity": 1, "unit_price_cents": 900}],
}
_RECORD = "SELECT state, workflow_run_id, workflow_started_at, updated_at FROM idempotency_records"


async def test_a_task_that_ends_before_the_mark_is_marked_by_its_outcome_write(
    stack: Stack, agent: Caller, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Longer than any task here takes, so the outcome always comes first.
    monkeypatch.setattr(_task_starts, "MARK_STARTED_AFTER", 60.0)
    async with open_service(stack, replay_wait_seconds=60) as service:
        answer = await service.call_tool(agent.principal, "create_order", ORDER, "order-mark-1")
    assert answer.status_code == 200, answer.body
    described = await stack.client.get_workflow_handle(answer.task_id).describe()
    [(state, run_id, started_at, updated_at)] = rows(database, _RECORD)
    assert (state, run_id) == ("succeeded", described.run_id)
    # One write after the claim: the outcome's, in the same statement as the mark.
    assert started_at == updated_at
    assert count(database, "orders") == 1


async def test_a_task_still_running_after_the_mark_delay_is_marked_while_its_starter_waits(
    stack: Stack, agent: Caller, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_task_starts, "MARK_STARTED_AFTER", 0.2)
    # No worker polls this queue: the task cannot end while the starter waits.
    idle = replace(stack, task_queue=f"{stack.task_queue}-idle")
    async with open_service(idle, replay_wait_seconds=60) as service:
        waiting = asyncio.create_task(
            service.call_tool(agent.principal, "create_order", ORDER, "order-mark-2")
        )
        try:
            marked = await eventually(
                lambda: rows(database, _RECORD),
                until=lambda found: len(found) == 1 and found[0][2] is not None,
                what="the record marked started while its starter waits",
            )
            assert not waiting.done(), "the starter still waits for the task"
        finally:
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
    [(state, run_id, _, _)] = marked
    described = await stack.client.get_workflow_handle(
        rows(database, "SELECT workflow_id FROM idempotency_records")[0][0]
    ).describe()
    assert (state, run_id) == ("processing", described.run_id)
    await stack.client.get_workflow_handle(described.id).terminate("test cleanup")


async def test_the_upkeep_pass_answers_an_unmarked_claim_only_with_its_own_requests_task(
    stack: Stack, agent: Caller, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_task_starts, "MARK_STARTED_AFTER", 60.0)
    idle = replace(stack, task_queue=f"{stack.task_queue}-idle")
    async with open_service(idle, replay_wait_seconds=60) as service:
        # The starter dies after starting the task and before marking it (its request
        # is cancelled while it waits): the claim is left unmarked.
        waiting = asyncio.create_task(
            service.call_tool(agent.principal, "create_order", ORDER, "order-mark-3")
        )

        async def started_task() -> str | None:
            claimed = rows(database, "SELECT workflow_id FROM idempotency_records")
            if not claimed:
                return None
            try:
                await stack.client.get_workflow_handle(claimed[0][0]).describe()
            except RPCError:
                return None
            return str(claimed[0][0])

        workflow_id = await eventually(started_task, what="the task started")
        assert not waiting.done(), "the starter still waits for the task"
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
    assert rows(database, "SELECT state, workflow_started_at FROM idempotency_records") == [
        ("processing", None)
    ]
    execute(database, "UPDATE idempotency_records SET lease_expires_at = now() - interval '1 s'")

    async def upkeep() -> PruneResult:
        return await stack.client.execute_workflow(
            PruneIdempotencyRecordsWorkflow.run,
            PruneInput(settle_after_seconds=0),
            id=f"upkeep-{uuid.uuid4().hex}",
            task_queue=idle.task_queue,
        )

    async with (
        build_pool(stack.postgres_url, max_size=2) as pool,
        build_worker(
            stack.client, pool, OnceflowSettings(task_queue=idle.task_queue), tools=builtin()
        ),
    ):
        await stack.client.get_workflow_handle(workflow_id).result()
        # Visibility may list the task as running for a moment after it closed.
        await eventually(
            upkeep,
            until=lambda done: done.settled == 1,
            what="an upkeep pass wrote the ended task's outcome into the unmarked claim",
            timeout=60,
        )
        [(state, code, body)] = rows(
            database, "SELECT state, status_code, response_body FROM idempotency_records"
        )
        assert (state, code, body["state"]) == ("succeeded", 200, "succeeded")

        # The same key claimed for another request after the record was pruned, its
        # owner dead before starting anything: the ended task under the key's workflow
        # id (visibility lists it closed: the pass above read it) was started for the
        # first request, so it does not answer this claim.
        execute(
            database,
            "UPDATE idempotency_records SET state = 'processing', status_code = NULL,"
            " response_body = NULL, workflow_started_at = NULL, workflow_run_id = NULL,"
            " owner_token = 'dead', request_hash = %s,"
            " lease_expires_at = now() - interval '1 s'",
            "v1:" + "0" * 64,
        )
        assert (await upkeep()).settled == 0
    assert rows(database, "SELECT state, response_body FROM idempotency_records") == [
        ("processing", None)
    ]
    assert count(database, "orders") == 1


async def test_a_task_its_starter_stopped_waiting_for_writes_its_own_outcome(
    stack: Stack, agent: Caller, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_task_starts, "MARK_STARTED_AFTER", 0.1)
    # Nobody answers the status query after the wait either: no need to wait long.
    monkeypatch.setattr(_task_starts, "STATUS_QUERY_TIMEOUT", 1.0)
    # No worker polls this queue while the starter waits: its wait ends first (202).
    idle = replace(stack, task_queue=f"{stack.task_queue}-late")
    async with open_service(idle, replay_wait_seconds=1) as service:
        answer = await service.call_tool(agent.principal, "create_order", ORDER, "order-mark-4")
    assert answer.status_code == 202, answer.body
    assert rows(database, "SELECT state FROM idempotency_records") == [("processing",)]

    # A worker comes; nobody repeats the request, asks for the task or runs the upkeep.
    async with (
        build_pool(stack.postgres_url, max_size=2) as pool,
        build_worker(
            stack.client, pool, OnceflowSettings(task_queue=idle.task_queue), tools=builtin()
        ),
    ):
        ended = await stack.client.get_workflow_handle(answer.task_id).result()
    # The task wrote its outcome before it ended.
    [(state, code, body)] = rows(
        database, "SELECT state, status_code, response_body FROM idempotency_records"
    )
    assert (state, code) == ("succeeded", 200)
    assert body["state"] == "succeeded"
    assert ended["state"] == "succeeded"
    assert count(database, "orders") == 1
    history = await stack.client.get_workflow_handle(answer.task_id).fetch_history()
    signals = [
        event.workflow_execution_signaled_event_attributes.signal_name
        for event in history.events
        if event.HasField("workflow_execution_signaled_event_attributes")
    ]
    assert signals == ["starter_stopped_waiting"]


async def test_a_task_that_waits_for_a_person_when_its_starter_stops_waiting_gets_no_signal(
    stack: Stack, database: str
) -> None:
    """It writes its outcome itself anyway (it asked people): the 202 sends no signal, one
    billable action less, and the record still gets the outcome once a person decided."""
    approver = await make_caller(database, tenant=new_tenant(), tools=("refund_payment",))
    # No amount: a refund of the whole payment always waits for an approval.
    refund = {"payment_intent": "pi_starter_gone"}
    async with open_service(stack, replay_wait_seconds=1) as service:
        answer = await service.call_tool(approver.principal, "refund_payment", refund, "refund-1")
    assert answer.status_code == 202, answer.body
    assert answer.body["state"] == "awaiting_approval"

    tasks = TaskClient(stack.client, task_queue=stack.task_queue)
    [step] = (await tasks.status(answer.task_id)).steps
    await tasks.approve(
        answer.task_id,
        ApproveInput(
            step_id=step.step_id,
            approved=False,
            approver="ops",
            reason="not this one",
            arguments_digest=step.arguments_digest,
        ),
    )
    assert (await tasks.result(answer.task_id)).state is TaskState.FAILED
    [(state, body)] = rows(database, "SELECT state, response_body FROM idempotency_records")
    assert (state, body["state"]) == ("failed", "failed")
    history = await stack.client.get_workflow_handle(answer.task_id).fetch_history()
    signalled = "workflow_execution_signaled_event_attributes"
    assert not any(event.HasField(signalled) for event in history.events)
