"""Decisions sent with an ``Idempotency-Key`` are claimed like every other POST.

Two gateway processes and one worker on the embedded stack. A ``start_deployment`` task
waits for approval before its first attempt, so a denial ends it without any deployment
target. The same key and body answer with the first answer (stored in PostgreSQL, status
and body unchanged, a refusal included); the same key with another decision, step or
task is 422 and reaches no task; a decision whose task gave no answer releases its claim;
a claim whose owner hung is taken over after its lease, and the hung owner can no longer
change the stored answer. Each test reads the records table and the task's own decision
record, not only the answers.
"""

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from temporalio.service import RPCError, RPCStatusCode

from onceflow.gateway import (
    KEY_REUSED_DETAIL,
    BackendUnavailable,
    BoundaryService,
    GatewaySettings,
    PrincipalStore,
)
from onceflow.idempotency import IdempotencyStore
from onceflow.storage import build_pool
from onceflow.task_api import DecisionAnswer, TaskClient
from onceflow.tools.worker import arguments_digest, key_digest
from onceflow.workflows.task_models import (
    AgentTaskInput,
    ApproveInput,
    StepInput,
    TaskState,
    TaskStatus,
)
from tests.harness import HANG_SECONDS, wait_for

from .conftest import Caller, GatewayProcess, Stack, count, make_caller, new_tenant, rows

RELEASE: dict[str, Any] = {"service": "checkout", "version": "2.4.1", "environment": "production"}
PROBLEM = "urn:onceflow:problem:"
RECORD = (
    "SELECT scope, state, status_code, response_body, resource_id, fencing_token,"
    " request_hash, updated_at FROM idempotency_records ORDER BY created_at"
)


def awaiting_approval(status: TaskStatus) -> bool:
    return status.state is TaskState.AWAITING_APPROVAL


def failed(status: TaskStatus) -> bool:
    return status.state is TaskState.FAILED


@pytest.fixture
def tasks(stack: Stack) -> TaskClient:
    return TaskClient(stack.client, task_queue=stack.task_queue)


@pytest.fixture
async def operator(database: str) -> Caller:
    """A principal of a fresh tenant that may approve and reconcile."""
    return await make_caller(database, tenant=new_tenant(), name="ops", may_decide=True)


async def deployment_awaiting_approval(tasks: TaskClient, tenant: str) -> tuple[str, str]:
    """A task of ``tenant`` whose one step waits for approval: its id and the digest."""
    task_id = f"decide-{uuid.uuid4().hex[:12]}"
    await tasks.start(
        AgentTaskInput(
            tenant=tenant,
            principal="agent-1",
            steps=[StepInput(step_id="deploy", tool="start_deployment", arguments=RELEASE)],
        ),
        workflow_id=task_id,
    )
    waiting = await wait_for(tasks, task_id, awaiting_approval)
    return task_id, waiting.step("deploy").arguments_digest


def deny(digest: str) -> dict[str, Any]:
    return {
        "step_id": "deploy",
        "approved": False,
        "reason": "change freeze",
        "arguments_digest": digest,
    }


def approve_url(gateway: GatewayProcess, task_id: str) -> str:
    return f"{gateway.url}/v1/tasks/{task_id}/approve"


def keyed(caller: Caller, key: str) -> dict[str, str]:
    return {**caller.headers, "Idempotency-Key": key}


def decisions(status: TaskStatus) -> list[tuple[str, bool]]:
    return [(decision.decision, decision.accepted) for decision in status.decisions]


async def test_the_same_key_and_decision_get_the_first_answer_again_after_the_task_ended(
    gateways: tuple[GatewayProcess, GatewayProcess],
    operator: Caller,
    tasks: TaskClient,
    http: httpx.AsyncClient,
    database: str,
) -> None:
    task_id, digest = await deployment_awaiting_approval(tasks, operator.principal.tenant)
    key = "deny-7f3c2a"

    first = await http.post(
        approve_url(gateways[0], task_id), json=deny(digest), headers=keyed(operator, key)
    )

    assert first.status_code == 200, first.text
    assert "Idempotent-Replayed" not in first.headers
    assert first.json()["replayed"] is False
    [(scope, state, code, body, resource_id, *_)] = rows(database, RECORD)
    assert scope == f"{operator.principal.tenant}:ops:task:approve"
    assert (state, code, body, resource_id) == ("succeeded", 200, first.json(), task_id)
    await wait_for(tasks, task_id, failed)  # a denial ends the task without an attempt

    # The answer was lost; the operator's tool retries through the other gateway.
    again = await http.post(
        approve_url(gateways[1], task_id), json=deny(digest), headers=keyed(operator, key)
    )

    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == first.content, "the stored answer, byte for byte"
    assert again.json()["replayed"] is False, "the body is the first answer's"
    assert rows(database, RECORD)[0][1:3] == ("succeeded", 200)
    final = await tasks.status(task_id)
    assert decisions(final) == [("deny", True)]
    assert final.step("deploy").attempts == []
    # Without a key the task still answers a repeat itself, as before keys were stored.
    unkeyed = await http.post(
        approve_url(gateways[0], task_id), json=deny(digest), headers=operator.headers
    )
    assert unkeyed.status_code == 200 and unkeyed.headers["Idempotent-Replayed"] == "true"
    assert unkeyed.json()["replayed"] is True
    assert unkeyed.json()["decision"]["decision"] == "deny"
    assert count(database, "idempotency_records") == 1
    assert decisions(await tasks.status(task_id)) == [("deny", True)]
    for gateway in gateways:
        assert key not in gateway.log(), "the raw key is never logged"
    assert any(key_digest(key) in gateway.log() for gateway in gateways)


async def test_the_same_key_with_another_decision_step_or_task_is_422_and_decides_nothing(
    gateways: tuple[GatewayProcess, GatewayProcess],
    operator: Caller,
    tasks: TaskClient,
    http: httpx.AsyncClient,
    database: str,
) -> None:
    tenant = operator.principal.tenant
    (task_id, digest), (other_task, other_digest) = await asyncio.gather(
        deployment_awaiting_approval(tasks, tenant), deployment_awaiting_approval(tasks, tenant)
    )
    key = "deny-once-41"
    first = await http.post(
        approve_url(gateways[0], task_id), json=deny(digest), headers=keyed(operator, key)
    )
    assert first.status_code == 200, first.text
    record_before = rows(database, RECORD)

    reuses = [
        (task_id, {**deny(digest), "approved": True}),  # another decision
        (task_id, {**deny(digest), "step_id": "other"}),  # another step
        (task_id, {**deny(digest), "reason": "another reason"}),  # another request
        (other_task, deny(other_digest)),  # another task
        (other_task, deny(digest)),  # another task, the very same body
    ]
    for target, body in reuses:
        refused = await http.post(
            approve_url(gateways[1], target), json=body, headers=keyed(operator, key)
        )
        assert refused.status_code == 422, (target, body, refused.text)
        assert refused.headers["content-type"].startswith("application/problem+json")
        problem = refused.json()
        assert problem["type"] == PROBLEM + "idempotency-key-reused"
        assert problem["detail"] == KEY_REUSED_DETAIL
        assert problem["key_digest"] == key_digest(key)
        assert key not in refused.text

    assert rows(database, RECORD) == record_before, "the record is untouched"
    assert decisions(await tasks.status(task_id)) == [("deny", True)]
    untouched = await tasks.status(other_task)
    assert untouched.state is TaskState.AWAITING_APPROVAL and untouched.decisions == []
    # The other task is decided under a key of its own.
    own = await http.post(
        approve_url(gateways[0], other_task),
        json=deny(other_digest),
        headers=keyed(operator, "deny-once-42"),
    )
    assert own.status_code == 200 and "Idempotent-Replayed" not in own.headers, own.text
    assert decisions(await wait_for(tasks, other_task, failed)) == [("deny", True)]
    assert count(database, "idempotency_records") == 2


async def test_a_refusal_from_the_task_is_the_keys_answer_to_every_retry(
    gateways: tuple[GatewayProcess, GatewayProcess],
    operator: Caller,
    tasks: TaskClient,
    http: httpx.AsyncClient,
    database: str,
) -> None:
    task_id, digest = await deployment_awaiting_approval(tasks, operator.principal.tenant)
    elsewhere = arguments_digest("start_deployment", {**RELEASE, "version": "9.9.9"})
    wrong = {**deny(digest), "approved": True, "arguments_digest": elsewhere}

    refused = await http.post(
        approve_url(gateways[0], task_id), json=wrong, headers=keyed(operator, "approve-9")
    )

    assert refused.status_code == 409, refused.text
    assert refused.json()["type"] == PROBLEM + "decision-refused"
    assert "Idempotent-Replayed" not in refused.headers
    [(_, state, code, body, resource_id, *_)] = rows(database, RECORD)
    assert (state, code, body, resource_id) == ("failed", 409, refused.json(), task_id)
    again = await http.post(
        approve_url(gateways[1], task_id), json=wrong, headers=keyed(operator, "approve-9")
    )
    assert again.status_code == 409
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["content-type"].startswith("application/problem+json")
    assert again.content == refused.content
    waiting = await tasks.status(task_id)
    assert waiting.state is TaskState.AWAITING_APPROVAL and waiting.decisions == []

    # A key is scoped to its route: the same key on reconcile is another request, and the
    # task's refusal there (the step is not parked) is that key's answer in that scope.
    abandon = {"step_id": "deploy", "decision": "abandon", "reason": "not parked yet"}
    reconcile_url = f"{gateways[0].url}/v1/tasks/{task_id}/reconcile"
    not_parked = await http.post(reconcile_url, json=abandon, headers=keyed(operator, "approve-9"))
    assert not_parked.status_code == 409, not_parked.text
    assert not_parked.json()["type"] == PROBLEM + "decision-refused"
    replayed = await http.post(reconcile_url, json=abandon, headers=keyed(operator, "approve-9"))
    assert replayed.headers["Idempotent-Replayed"] == "true"
    assert replayed.content == not_parked.content

    # Once the task has ended, another decision is a conflict; its key keeps that too.
    denied = await http.post(
        approve_url(gateways[0], task_id), json=deny(digest), headers=keyed(operator, "deny-9")
    )
    assert denied.status_code == 200, denied.text
    await wait_for(tasks, task_id, failed)
    late = {**deny(digest), "approved": True}
    conflict = await http.post(
        approve_url(gateways[0], task_id), json=late, headers=keyed(operator, "late-9")
    )
    assert conflict.status_code == 409, conflict.text
    assert conflict.json()["type"] == PROBLEM + "decision-conflict"
    assert conflict.json()["task_state"] == "failed"
    late_again = await http.post(
        approve_url(gateways[1], task_id), json=late, headers=keyed(operator, "late-9")
    )
    assert late_again.status_code == 409
    assert late_again.headers["Idempotent-Replayed"] == "true"
    assert late_again.content == conflict.content

    assert [row[1:3] for row in rows(database, RECORD)] == [
        ("failed", 409),
        ("failed", 409),
        ("succeeded", 200),
        ("failed", 409),
    ]
    assert {row[0].rsplit(":", 1)[1] for row in rows(database, RECORD)} == {
        "approve",
        "reconcile",
    }
    assert decisions(await tasks.status(task_id)) == [("deny", True)]


class UnreachableOnce(TaskClient):
    """The task service, unreachable for the first decision sent through it."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(stack.client, task_queue=stack.task_queue)
        self.failures_left = 1

    async def approve(self, workflow_id: str, decision: ApproveInput) -> DecisionAnswer:
        if self.failures_left:
            self.failures_left -= 1
            raise RPCError("connection refused", RPCStatusCode.UNAVAILABLE, b"")
        return await super().approve(workflow_id, decision)


class HeldBeforeSending(TaskClient):
    """A gateway that hangs after its claim, before its decision reaches the task."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(stack.client, task_queue=stack.task_queue)
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def approve(self, workflow_id: str, decision: ApproveInput) -> DecisionAnswer:
        self.holding.set()
        await self.release.wait()
        return await super().approve(workflow_id, decision)


@asynccontextmanager
async def boundary(
    stack: Stack, tasks: TaskClient, **settings: Any
) -> AsyncIterator[BoundaryService]:
    """An in-process boundary service whose decisions go through ``tasks``."""
    async with build_pool(stack.postgres_url, max_size=4) as pool:
        yield BoundaryService(
            principals=PrincipalStore(pool),
            records=IdempotencyStore(pool),
            tasks=tasks,
            settings=GatewaySettings(**settings),
        )


async def test_a_decision_the_task_never_answered_releases_its_key_for_the_retry(
    stack: Stack, operator: Caller, tasks: TaskClient, database: str
) -> None:
    task_id, digest = await deployment_awaiting_approval(tasks, operator.principal.tenant)
    async with boundary(stack, UnreachableOnce(stack)) as service:
        with pytest.raises(BackendUnavailable):
            await service.approve(operator.principal, task_id, deny(digest), "deny-503")
        assert count(database, "idempotency_records") == 0, "no half-written record"
        assert (await tasks.status(task_id)).decisions == []

        retry = await service.approve(operator.principal, task_id, deny(digest), "deny-503")

    assert not retry.replayed and retry.answer.step_id == "deploy"
    [(_, state, code, body, *_)] = rows(database, RECORD)
    assert (state, code, body) == ("succeeded", 200, retry.body)
    assert decisions(await wait_for(tasks, task_id, failed)) == [("deny", True)]


async def test_a_hung_owner_is_taken_over_after_its_lease_and_cannot_change_the_answer(
    stack: Stack, operator: Caller, tasks: TaskClient, database: str
) -> None:
    task_id, digest = await deployment_awaiting_approval(tasks, operator.principal.tenant)
    held = HeldBeforeSending(stack)
    async with (
        boundary(stack, held, claim_lease_seconds=0.5) as hung,
        boundary(stack, tasks, replay_wait_seconds=20) as healthy,
    ):
        owner = asyncio.create_task(
            hung.approve(operator.principal, task_id, deny(digest), "deny-held")
        )
        await asyncio.wait_for(held.holding.wait(), timeout=HANG_SECONDS)
        assert rows(database, RECORD)[0][1] == "processing"

        # Waits while the lease runs, then takes the claim over and sends the decision.
        retry = await healthy.approve(operator.principal, task_id, deny(digest), "deny-held")
        assert not retry.replayed
        [(_, state, code, body, _, fencing_token, *_)] = rows(database, RECORD)
        assert (state, code, body, fencing_token) == ("succeeded", 200, retry.body, 2)

        # The hung owner wakes up: the task answers its resend with the one decision, and
        # its write to the record is fenced off.
        held.release.set()
        late = await asyncio.wait_for(owner, timeout=HANG_SECONDS)
        assert late.replayed and late.answer.replayed
        again = await healthy.approve(operator.principal, task_id, deny(digest), "deny-held")

    assert again.replayed and again.body == retry.body
    assert rows(database, RECORD)[0][1:6] == ("succeeded", 200, retry.body, task_id, 2)
    assert decisions(await wait_for(tasks, task_id, failed)) == [("deny", True)]
