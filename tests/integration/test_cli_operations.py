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
from onceflow.retry_policy import OutcomeClass
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient
from onceflow.tools import tool_activities
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.task_models import AgentTaskInput, StepInput, StepState, TaskState
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
        records = IdempotencyRecordActivities(pool)
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
