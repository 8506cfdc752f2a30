"""Decisions at the boundary: late, repeated and conflicting ones get documented answers.

(Here rather than under tests/gateway: the scripted tools it registers in this process's
catalogue would show up in the MCP tests' tool listings.)

A gateway process sends approve and reconcile decisions to tasks run by a worker with
the scripted tools. The same decision again (its first answer lost) answers with the
earlier one, flagged as a replay; another decision on a decided step, or any decision
on an ended task, is a ``decision-conflict`` (409) carrying the task's state; never a
5xx. The task's own decision record (its status) shows that exactly one was taken.
"""

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.activities import IdempotencyRecordActivities
from onceflow.retry_policy import OutcomeClass
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.task_models import AgentTaskInput, StepInput, TaskState
from tests.gateway.conftest import (
    GatewayProcess,
    Stack,
    make_caller,
    new_tenant,
    start_gateway,
)
from tests.harness import parked, wait_for
from tests.workflows.scripted_tools import Script, register_scripted_tools

PROBLEM = "urn:onceflow:problem:"


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client that never retries by itself."""
    async with httpx.AsyncClient(timeout=60) as client:
        yield client


class Scripted:
    """The module's stack, its script and the client that starts tasks on it."""

    def __init__(self, stack: Stack, script: Script) -> None:
        self.stack = stack
        self.script = script
        self.tasks = TaskClient(stack.client, task_queue=stack.task_queue)

    async def start(self, tenant: str, tool: str, label: str, amount: int = 0) -> str:
        task_id = f"decide-{uuid.uuid4().hex[:10]}"
        await self.tasks.start(
            AgentTaskInput(
                tenant=tenant,
                principal="agent",
                steps=[
                    StepInput(step_id="s", tool=tool, arguments={"label": label, "amount": amount})
                ],
            ),
            workflow_id=task_id,
        )
        return task_id


@pytest.fixture(scope="module")
async def scripted(postgres_url: str, dev_server: WorkflowEnvironment) -> AsyncIterator[Scripted]:
    register_scripted_tools()
    script = Script()
    stack = Stack(
        postgres_url=postgres_url,
        temporal_address=dev_server.client.service_client.config.target_host,
        task_queue=f"decide-{uuid.uuid4().hex[:10]}",
        client=dev_server.client,
    )
    async with build_pool(postgres_url, max_size=4) as pool:
        records = IdempotencyRecordActivities(
            pool, TaskClient(dev_server.client, task_queue=stack.task_queue)
        )
        async with Worker(
            dev_server.client,
            task_queue=stack.task_queue,
            workflows=[AgentTaskWorkflow],
            activities=[records.record_task_outcome, *script.activities()],
        ):
            yield Scripted(stack, script)


@pytest.fixture(scope="module")
def gateway(
    scripted: Scripted, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    process = start_gateway(scripted.stack, tmp_path_factory.mktemp("decisions") / "g.log")
    yield process
    process.stop()


async def _post(
    http: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict[str, Any], **extra: str
) -> httpx.Response:
    response = await http.post(url, json=body, headers={**headers, **extra})
    assert response.status_code < 500, response.text
    return response


async def test_a_repeated_approval_answers_with_it_and_a_late_one_is_a_conflict(
    scripted: Scripted, gateway: GatewayProcess, http: httpx.AsyncClient, database: str
) -> None:
    tenant = new_tenant()
    operator = await make_caller(database, tenant=tenant, name="ops", may_decide=True)
    task_id = await scripted.start(tenant, "scripted_approval", "gate", amount=900)
    waiting = await wait_for(
        scripted.tasks, task_id, lambda status: status.state is TaskState.AWAITING_APPROVAL
    )
    url = f"{gateway.url}/v1/tasks/{task_id}/approve"
    deny = {
        "step_id": "s",
        "approved": False,
        "reason": "not today",
        "arguments_digest": waiting.step("s").arguments_digest,
    }

    malformed = await _post(http, url, operator.headers, deny, **{"Idempotency-Key": "bad key"})
    assert malformed.status_code == 400
    assert malformed.json()["type"] == PROBLEM + "idempotency-key-malformed"

    first = await _post(http, url, operator.headers, deny, **{"Idempotency-Key": "deny-1"})
    assert first.status_code == 200, first.text
    assert first.json()["replayed"] is False and "Idempotent-Replayed" not in first.headers

    # The answer was lost; the operator's tool sends the same decision again: under the
    # same key it gets the first answer, byte for byte...
    again = await _post(http, url, operator.headers, deny, **{"Idempotency-Key": "deny-1"})
    assert again.status_code == 200, again.text
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    # ...and without a key the task answers with the decision it already holds.
    keyless = await _post(http, url, operator.headers, deny)
    assert keyless.status_code == 200, keyless.text
    assert keyless.headers["Idempotent-Replayed"] == "true"
    assert keyless.json()["replayed"] is True
    assert keyless.json()["decision"]["decision"] == "deny"
    assert keyless.json()["decision"]["operator"] == "ops"

    ended = await wait_for(scripted.tasks, task_id, lambda status: status.state is TaskState.FAILED)
    # Once the task has ended: the same decision still answers with itself...
    late_repeat = await _post(http, url, operator.headers, deny)
    assert late_repeat.status_code == 200 and late_repeat.json()["replayed"] is True
    # ...and the other decision is a conflict naming the task's and the step's state.
    conflict = await _post(http, url, operator.headers, {**deny, "approved": True})
    assert conflict.status_code == 409, conflict.text
    problem = conflict.json()
    assert conflict.headers["content-type"].startswith("application/problem+json")
    assert problem["type"] == PROBLEM + "decision-conflict"
    assert (problem["task_state"], problem["step_state"]) == ("failed", "denied")
    assert problem["decision"]["decision"] == "deny"

    final = await scripted.tasks.status(task_id)
    assert [(d.decision, d.accepted) for d in final.decisions] == [("deny", True)]
    assert final.step("s").attempts == ended.step("s").attempts == []
    assert scripted.script.attempts("gate") == 0


async def test_a_repeated_reconciliation_answers_with_it_and_another_is_a_conflict(
    scripted: Scripted, gateway: GatewayProcess, http: httpx.AsyncClient, database: str
) -> None:
    tenant = new_tenant()
    operator = await make_caller(database, tenant=tenant, name="ops", may_decide=True)
    label = scripted.script.plan(f"lost-{uuid.uuid4().hex[:6]}", OutcomeClass.UNKNOWN)
    task_id = await scripted.start(tenant, "scripted_unsafe", label)
    await wait_for(scripted.tasks, task_id, parked)
    url = f"{gateway.url}/v1/tasks/{task_id}/reconcile"
    happened = {
        "step_id": "s",
        "decision": "happened",
        "resource_id": "res-found",
        "reason": "seen at the provider",
    }

    first = await _post(http, url, operator.headers, happened)
    assert first.status_code == 200 and first.json()["replayed"] is False, first.text
    await wait_for(scripted.tasks, task_id, lambda status: status.state is TaskState.SUCCEEDED)

    again = await _post(http, url, operator.headers, happened, **{"Idempotency-Key": "r-1"})
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    for other in (
        {**happened, "resource_id": "res-elsewhere"},
        {"step_id": "s", "decision": "abandon", "reason": "changed my mind"},
    ):
        conflict = await _post(http, url, operator.headers, other)
        assert conflict.status_code == 409, conflict.text
        problem = conflict.json()
        assert problem["type"] == PROBLEM + "decision-conflict"
        assert (problem["task_state"], problem["step_state"]) == ("succeeded", "succeeded")
        assert "already ended" in problem["detail"]

    final = await scripted.tasks.status(task_id)
    assert [(d.decision, d.accepted) for d in final.decisions] == [("happened", True)]
    assert final.step("s").resource_id == "res-found"
    assert scripted.script.attempts(label) == 1  # the one attempt that parked
