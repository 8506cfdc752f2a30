"""The claim's lease and fencing, and the task writing its own outcome to the record.

A gateway can die between claiming a key and starting the task; the claim's lease lets
a retry take over (with a new fencing token) only after it expires, and the former
owner can then no longer write.
"""

import asyncio
import uuid
from dataclasses import replace
from datetime import timedelta

import httpx
import pytest

from onceflow.gateway import RequestInProgress, _task_starts, request_fingerprint
from onceflow.idempotency import AlreadyClaimed, Claimed, IdempotencyStore, NewClaim
from onceflow.settings import OnceflowSettings
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient
from onceflow.worker import build_worker
from onceflow.workflows.pruning import PruneIdempotencyRecordsWorkflow
from onceflow.workflows.pruning_models import PruneInput, PruneResult
from onceflow.workflows.task_models import TaskState
from tests.harness import eventually
from tests.tool_configuration import builtin

from .conftest import (
    Caller,
    GatewayProcess,
    HoldAfterClaim,
    Stack,
    count,
    execute,
    open_service,
    rows,
    start_gateway,
)
from .held_gateway import HELD

ORDER = {
    "customer_id": "c-lease",
    "currency": "eur",
    "lines": [{"sku": "mug", "quantity": 1, "unit_price_cents": 900}],
}


async def test_a_gateway_killed_between_claim_and_start_is_taken_over_after_the_lease(
    stack: Stack,
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
    tmp_path: object,
) -> None:
    faulty = start_gateway(
        stack,
        tmp_path / "faulty.log",  # type: ignore[operator]
        module="tests.gateway.held_gateway",
        ONCEFLOW_GATEWAY_CLAIM_LEASE_SECONDS="2",
    )
    headers = {**agent.headers, "Idempotency-Key": "order-crash-1"}
    try:
        pending = asyncio.create_task(
            http.post(f"{faulty.url}/v1/tools/create_order/calls", json=ORDER, headers=headers)
        )
        await eventually(lambda: HELD in faulty.log(), what="the gateway holds its claim")
        faulty.kill()
        with pytest.raises(httpx.TransportError):
            await pending
    finally:
        faulty.stop()

    # The claim survived the crash; nothing was started.
    assert rows(
        database, "SELECT state, fencing_token, workflow_started_at FROM idempotency_records"
    ) == [("processing", 1, None)]
    assert count(database, "orders") == 0
    assert await stack.task_workflows(agent.principal.tenant) == 0

    [(lapsed_at,)] = rows(database, "SELECT lease_expires_at FROM idempotency_records")
    retry = await http.post(
        f"{gateways[0].url}/v1/tools/create_order/calls", json=ORDER, headers=headers
    )

    # Taken over within the retry's own wait for the claim (an answer, not "in progress"),
    # and only after the dead gateway's 2 s lease had lapsed.
    assert retry.status_code == 200, retry.text
    assert "Idempotent-Replayed" not in retry.headers, "the retry ran the operation itself"
    [(state, fencing_token, started_at)] = rows(
        database, "SELECT state, fencing_token, workflow_started_at FROM idempotency_records"
    )
    assert (state, fencing_token) == ("succeeded", 2)
    assert started_at > lapsed_at, "the task started before the dead owner's lease lapsed"
    assert count(database, "orders") == 1
    assert await stack.task_workflows(agent.principal.tenant) == 1
    again = await http.post(
        f"{gateways[1].url}/v1/tools/create_order/calls", json=ORDER, headers=headers
    )
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == retry.content
    assert count(database, "orders") == 1


async def test_a_request_meeting_an_unexpired_claim_gets_409_with_retry_after(
    stack: Stack, agent: Caller, database: str
) -> None:
    holding = HoldAfterClaim()
    async with (
        open_service(stack, after_claim=holding.hold, claim_lease_seconds=30) as owner,
        open_service(stack, replay_wait_seconds=0.3) as other,
    ):
        claiming = asyncio.create_task(
            owner.call_tool(agent.principal, "create_order", ORDER, "order-busy-1")
        )
        await holding.claimed.wait()

        with pytest.raises(RequestInProgress) as busy:
            await other.call_tool(agent.principal, "create_order", ORDER, "order-busy-1")

        claiming.cancel()  # the owner "dies" while holding the claim
        await asyncio.gather(claiming, return_exceptions=True)
    assert 25 <= busy.value.retry_after_seconds <= 30
    assert busy.value.problem()["status"] == 409
    assert count(database, "orders") == 0
    assert await stack.task_workflows(agent.principal.tenant) == 0


async def test_after_a_takeover_the_former_owner_can_no_longer_write(
    agent: Caller, database: str
) -> None:
    async with build_pool(database, max_size=2) as pool:
        store = IdempotencyStore(pool)
        claim = NewClaim(
            scope=f"{agent.principal.tenant}:{agent.principal.name}:create_order:call",
            idempotency_key="order-fenced-1",
            request_hash=request_fingerprint(
                operation="tools.call", scope="s", route="r", body={"x": 1}
            ),
            tenant=agent.principal.tenant,
            principal_id=agent.principal.principal_id,
            workflow_id="wf-fenced-1",
            lease=timedelta(seconds=30),
            result_retention=timedelta(days=1),
            key_quota=10,
            quota_window_seconds=60,
        )
        first = await store.claim(claim)
        assert isinstance(first, Claimed)
        again = await store.claim(claim)
        assert isinstance(again, AlreadyClaimed)
        assert not again.record.lease_expired
        assert await store.take_over(again.record, lease=claim.lease) is None, "lease still held"

        execute(
            database, "UPDATE idempotency_records SET lease_expires_at = now() - interval '1 s'"
        )
        expired = await store.get(claim.scope, claim.idempotency_key)
        assert expired is not None and expired.lease_expired
        new_owner = await store.take_over(expired, lease=claim.lease)
        assert new_owner is not None and new_owner.fencing_token == 2

        assert await store.mark_started(first.record, run_id="old") is False
        assert await store.release(first.record) is False
        assert await store.take_over(expired, lease=claim.lease) is None, "fencing token moved on"
        assert await store.mark_started(new_owner, run_id="new") is True
    assert rows(database, "SELECT fencing_token, workflow_run_id FROM idempotency_records") == [
        (2, "new")
    ]


async def test_the_upkeep_pass_writes_the_outcome_a_starter_that_died_left(
    stack: Stack, agent: Caller, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_task_starts, "MARK_STARTED_AFTER", 0.1)
    # A task queue no worker polls yet: the task cannot finish while its starter waits.
    # The starter dies after marking the record (its request cancelled), so neither it
    # nor the task writes the outcome (a starter that stopped waiting would have told the
    # task to); the prune schedule's upkeep pass must.
    idle = replace(stack, task_queue=f"{stack.task_queue}-idle")
    async with open_service(idle, replay_wait_seconds=60) as service:
        waiting = asyncio.create_task(
            service.call_tool(agent.principal, "create_order", ORDER, "order-async-1")
        )
        [(workflow_id, _)] = await eventually(
            lambda: rows(
                database, "SELECT workflow_id, workflow_started_at FROM idempotency_records"
            ),
            until=lambda found: len(found) == 1 and found[0][1] is not None,
            what="the record marked started while its starter waits",
        )
        assert not waiting.done(), "the starter still waits for the task"
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        task_id = str(workflow_id)

        tasks = TaskClient(stack.client, task_queue=idle.task_queue)
        async with (
            build_pool(stack.postgres_url, max_size=2) as pool,
            build_worker(
                stack.client, pool, OnceflowSettings(task_queue=idle.task_queue), tools=builtin()
            ),
        ):
            assert (await tasks.result(task_id)).state is TaskState.SUCCEEDED
            assert rows(database, "SELECT state FROM idempotency_records") == [("processing",)]

            async def upkeep() -> PruneResult:
                return await stack.client.execute_workflow(
                    PruneIdempotencyRecordsWorkflow.run,
                    PruneInput(settle_after_seconds=0),
                    id=f"upkeep-{uuid.uuid4().hex}",
                    task_queue=idle.task_queue,
                )

            # Visibility may list the task as running for a moment after it closed.
            await eventually(
                upkeep,
                until=lambda done: done.settled == 1,
                what="an upkeep pass wrote the ended task's outcome",
                timeout=60,
            )
        stored = rows(database, "SELECT state, status_code, response_body FROM idempotency_records")
        assert [(state, code) for state, code, _ in stored] == [("succeeded", 200)]
        assert stored[0][2]["state"] == "succeeded"
        replay = await service.call_tool(agent.principal, "create_order", ORDER, "order-async-1")
    assert replay.replayed
    assert replay.body == stored[0][2]
    assert count(database, "orders") == 1


async def test_a_record_left_processing_after_the_task_closed_uses_the_task_result(
    stack: Stack, agent: Caller, database: str
) -> None:
    async with open_service(stack) as service:
        first = await service.call_tool(agent.principal, "create_order", ORDER, "order-lost-1")
        assert first.status_code == 200
        # As if every record_task_outcome attempt had failed: the record still processing.
        execute(
            database,
            "UPDATE idempotency_records SET state = 'processing', status_code = NULL,"
            " response_body = NULL",
        )

        retry = await service.call_tool(agent.principal, "create_order", ORDER, "order-lost-1")

    assert retry.status_code == 200
    assert retry.replayed
    assert retry.body == first.body
    assert rows(database, "SELECT state FROM idempotency_records") == [("succeeded",)]
    assert count(database, "orders") == 1
