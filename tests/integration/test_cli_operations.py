"""The operator's CLI against the real dev server: call, status, tasks, reconcile, approve."""

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import psycopg
import pytest
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.activities import IdempotencyRecordActivities
from onceflow.cli.main import WAIT_EXIT_CODES
from onceflow.gateway import KEY_REUSED_DETAIL
from onceflow.retry_policy import OutcomeClass
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient
from onceflow.tools.worker import tool_activities
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.task_models import (
    AgentTaskInput,
    CallInput,
    OpenTaskOptions,
    StepInput,
    StepState,
    TaskState,
)
from tests.harness import REPO, eventually, onceflow_command, wait_for
from tests.tool_configuration import builtin
from tests.workflows.scripted_tools import Script, register_scripted_tools


@dataclass
class Cli:
    env: dict[str, str]
    script: Script

    async def __call__(self, *arguments: str) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            *onceflow_command(*arguments),
            cwd=REPO,
            env={**os.environ, **self.env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), timeout=60)
        assert b"Traceback" not in err, err.decode()
        return process.returncode or 0, out.decode(), err.decode()


@pytest.fixture
async def cli(
    dev_server: WorkflowEnvironment, database: str, task_queue: str
) -> AsyncIterator[Cli]:
    """A worker with the reference and scripted tools, and the CLI pointed at it."""
    register_scripted_tools()
    script = Script()
    async with build_pool(database) as pool:
        records = IdempotencyRecordActivities(
            pool, TaskClient(dev_server.client, task_queue=task_queue)
        )
        reference = [
            activity for tool in builtin() for activity in tool_activities(tool, pool, None)
        ]
        async with Worker(
            dev_server.client,
            task_queue=task_queue,
            workflows=[AgentTaskWorkflow],
            activities=[
                *reference,
                records.record_task_outcome,
                records.prune_idempotency_records,
                *script.activities(),
            ],
        ):
            yield Cli(
                {
                    "TEMPORAL_ADDRESS": dev_server.client.service_client.config.target_host,
                    "ONCEFLOW_TASK_QUEUE": task_queue,
                    "USER": "ops-alice",
                },
                script,
            )


async def test_call_with_the_same_key_twice_issues_one_coupon(cli: Cli, database: str) -> None:
    user = f"u-{uuid.uuid4().hex[:6]}"
    arguments = json.dumps({"user_id": user, "coupon_id": "SUMMER"})
    call = (
        "call",
        "issue_coupon",
        "--tenant",
        "acme",
        "--key",
        f"agent-{user}",
        "--args",
        arguments,
        "--wait",
    )

    code, out, _ = await cli(*call)
    again_code, again_out, _ = await cli(*call)

    first, again = json.loads(out), json.loads(again_out)
    assert code == again_code == 0
    assert first["state"] == again["state"] == "succeeded"
    assert first["workflow_id"] == again["workflow_id"]
    assert first["steps"][0]["resource_id"] == again["steps"][0]["resource_id"]
    with psycopg.connect(database) as conn:
        rows = conn.execute(
            "SELECT issuance_id FROM coupon_issuances WHERE user_id = %s", (user,)
        ).fetchall()
    assert [str(row[0]) for row in rows] == [first["steps"][0]["resource_id"]]


async def test_an_operator_finds_a_parked_task_and_reconciles_it(
    cli: Cli, dev_server: WorkflowEnvironment, task_queue: str
) -> None:
    client = TaskClient(dev_server.client, task_queue=task_queue)
    task_id = f"parked-{uuid.uuid4().hex[:8]}"
    cli.script.plan("parks", OutcomeClass.UNKNOWN)
    await client.start(
        AgentTaskInput(
            tenant="cli-tenant",
            principal="agent",
            steps=[StepInput(step_id="pay", tool="scripted_unsafe", arguments={"label": "parks"})],
        ),
        workflow_id=task_id,
    )
    await eventually(
        lambda: cli("tasks", "--state", "parked", "--tenant", "cli-tenant"),
        until=lambda answer: task_id in answer[1],
        what=f"`onceflow tasks --state parked` lists {task_id}",
        timeout=60,
        interval=0.5,
    )

    code, shown, _ = await cli("status", task_id)
    assert code == 0 and "parked" in shown and f"onceflow reconcile {task_id} --step pay" in shown

    code, out, err = await cli(
        "reconcile",
        task_id,
        "--step",
        "pay",
        "--decision",
        "happened",
        "--resource-id",
        "pi_found_in_dashboard",
        "--reason",
        "saw it in the dashboard",
    )
    assert code == 0, err
    assert "succeeds with resource pi_found_in_dashboard" in out

    code, _, err = await cli(
        "reconcile", task_id, "--step", "pay", "--decision", "abandon", "--reason", "again"
    )
    assert code == 1 and "already ended" in err

    result = await client.result(task_id)
    assert result.state is TaskState.SUCCEEDED
    assert result.step("pay").resource_id == "pi_found_in_dashboard"
    [decision] = result.decisions
    assert (decision.operator, decision.reason) == ("ops-alice", "saw it in the dashboard")
    # Its end was not upserted (since 0.6.0 its close status says it): listed as succeeded,
    # and no longer as parked.
    await listed_as(cli, task_id, "succeeded", "--tenant", "cli-tenant")
    code, out, _ = await cli("tasks", "--state", "parked", "--tenant", "cli-tenant", "--json")
    assert code == 0 and task_id not in {task["task_id"] for task in json.loads(out)}


async def listed_as(cli: Cli, task_id: str, state: str, *filters: str) -> None:
    """``onceflow tasks --state <state>`` lists the task, in that state (visibility is
    eventually consistent: polled)."""

    async def listing() -> dict[str, str]:
        code, out, err = await cli("tasks", "--state", state, *filters, "--json")
        assert code == 0, err
        return {task["task_id"]: task["state"] for task in json.loads(out)}

    await eventually(
        listing,
        until=lambda listed: listed.get(task_id) == state,
        what=f"`onceflow tasks --state {state}` lists {task_id} as {state}",
        timeout=60,
        interval=0.5,
    )


async def test_an_approver_denies_a_step_from_the_cli(
    cli: Cli, dev_server: WorkflowEnvironment, task_queue: str
) -> None:
    client = TaskClient(dev_server.client, task_queue=task_queue)
    task_id = f"gated-{uuid.uuid4().hex[:8]}"
    await client.start(
        AgentTaskInput(
            tenant="acme",
            principal="agent",
            steps=[
                StepInput(
                    step_id="r",
                    tool="scripted_approval",
                    arguments={"label": "gate-cli", "amount": 900},
                )
            ],
        ),
        workflow_id=task_id,
    )
    await wait_for(client, task_id, lambda status: status.state is TaskState.AWAITING_APPROVAL)

    code, out, err = await cli("approve", task_id, "--step", "r", "--deny", "--reason", "too large")
    assert code == 0, err
    assert "'amount': 900" in err  # the approver is shown what they decide on

    result = await client.result(task_id)
    assert result.state is TaskState.FAILED
    assert result.step("r").state is StepState.DENIED
    assert result.step("r").attempts == []


async def test_call_refuses_a_key_already_used_for_other_arguments(cli: Cli, database: str) -> None:
    user = f"u-{uuid.uuid4().hex[:6]}"
    base = ("call", "issue_coupon", "--tenant", "acme", "--key", f"parity-{user}", "--wait")

    code, out, err = await cli(*base, "--args", json.dumps({"user_id": user, "coupon_id": "A"}))
    assert code == 0, err
    code, out, err = await cli(*base, "--args", json.dumps({"user_id": user, "coupon_id": "B"}))

    # The gateway's 422 wording, exit 2 (bad input), and nothing printed as a result.
    assert code == 2 and out == ""
    assert KEY_REUSED_DETAIL in " ".join(err.split())
    with psycopg.connect(database) as conn:
        coupons = conn.execute(
            "SELECT coupon_id FROM coupon_issuances WHERE user_id = %s", (user,)
        ).fetchall()
    assert coupons == [("A",)]


async def test_call_wait_returns_when_the_task_awaits_a_person_and_decisions_repeat_safely(
    cli: Cli, dev_server: WorkflowEnvironment
) -> None:
    tenant = f"tenant-with-a-rather-long-name-{uuid.uuid4().hex[:8]}"
    call = (
        "call",
        "refund_payment",
        "--tenant",
        tenant,
        "--key",
        "refund-1",
        "--args",
        json.dumps({"payment_intent": "pi_cli_wait"}),  # no amount: always needs approval
        "--wait",
    )

    code, out, err = await cli(*call)
    waiting = json.loads(out)
    assert code == WAIT_EXIT_CODES[TaskState.AWAITING_APPROVAL] == 5, err
    assert waiting["state"] == "awaiting_approval"
    task_id = waiting["workflow_id"]

    deny = ("approve", task_id, "--step", "1", "--deny", "--reason", "not this one")
    code, out, err = await cli(*deny)
    assert code == 0 and "accepted:" in out, err
    # The same decision again (its answer lost): answered with the earlier one, exit 0.
    code, out, err = await cli(*deny)
    assert code == 0 and "already decided:" in out and "ops-alice" in out, err
    # Another decision on the decided step: a conflict naming the task's state, exit 1.
    code, out, err = await cli("approve", task_id, "--step", "1", "--approve", "--reason", "x")
    assert code == 1 and "conflict:" in err and "deny" in err, err

    code, out, err = await cli(*call)
    assert code == WAIT_EXIT_CODES[TaskState.FAILED] == 3, err
    assert json.loads(out)["state"] == "failed"
    final = await TaskClient(dev_server.client, task_queue="unused").status(task_id)
    assert [(d.decision, d.accepted) for d in final.decisions] == [("deny", True)]
    assert final.step("1").attempts == []  # nothing reached the provider

    # Listings never cut the id, as a table (80 columns when piped) or as JSON.
    code, out, err = await cli("tasks", "--tenant", tenant)
    assert code == 0 and task_id in out, err
    code, out, err = await cli("tasks", "--tenant", tenant, "--json")
    assert code == 0, err
    assert [(task["task_id"], task["tenant"]) for task in json.loads(out)] == [(task_id, tenant)]
    code, out, err = await cli("status", task_id, "--json")
    assert code == 0 and json.loads(out)["workflow_id"] == task_id, err
    await listed_as(cli, task_id, "failed", "--tenant", tenant)


async def test_the_cli_lists_open_tasks_shows_their_calls_and_decides_a_parked_call(
    cli: Cli, dev_server: WorkflowEnvironment, task_queue: str
) -> None:
    tasks = TaskClient(dev_server.client, task_queue=task_queue)
    workflow_id = f"open-{uuid.uuid4().hex}"
    opened = AgentTaskInput(tenant="acme", principal="agent-1", open=OpenTaskOptions())
    first = CallInput(call_id="look", tool="scripted_safe", arguments={"label": "cli-l"})
    await tasks.call(workflow_id, first, start=opened)
    await tasks.call(workflow_id, first.model_copy(update={"call_id": "look-again"}))
    plan = cli.script.plan("cli-p", OutcomeClass.UNKNOWN)
    pay = CallInput(call_id="pay", tool="scripted_unsafe", arguments={"label": plan})
    assert (await tasks.call(workflow_id, pay)).call.state is StepState.PARKED

    code, out, _ = await cli("tasks", "--open", "--json")
    assert code == 0
    [listed] = [task for task in json.loads(out) if task["task_id"] == workflow_id]
    assert (listed["kind"], listed["state"]) == ("open", "parked")
    code, out, _ = await cli("status", workflow_id)
    assert code == 0
    assert "open task, 3 call(s)" in out and "repeat of look" in out
    assert f"onceflow reconcile {workflow_id} --step pay" in out

    code, out, err = await cli(
        "reconcile",
        workflow_id,
        "--step",
        "pay",
        "--decision",
        "happened",
        "--resource-id",
        "res-cli",
        "--reason",
        "found it",
    )
    assert code == 0, err
    decided = await tasks.call(workflow_id, pay.model_copy(update={"wait_until_ended": True}))
    assert (decided.call.state, decided.call.resource_id) == (StepState.SUCCEEDED, "res-cli")
    assert cli.script.attempts("cli-l") == 1 and cli.script.attempts("cli-p") == 1
    await tasks.close(workflow_id)
    assert (await tasks.result(workflow_id)).state is TaskState.CLOSED
    await listed_as(cli, workflow_id, "closed", "--open")
