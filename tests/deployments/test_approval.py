"""A deployment starts only after a person approves its exact arguments; a denial or an
approval of other arguments never lets it write anything at the target."""

import asyncio

import pytest
from onceflow_devstack.deploy_target import RunningTarget
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.task_api import DecisionRefused, TaskClient
from onceflow.tools.worker import arguments_digest
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.task_models import ApproveInput, StepState, TaskState, TaskStatus
from tests.harness import HANG_SECONDS, workflow_idle

from .conftest import RELEASE, deployment_id, deployment_rows, start_deployment, wait_for, writes


def awaiting_approval(status: TaskStatus) -> bool:
    return status.state is TaskState.AWAITING_APPROVAL


def decision(digest: str, *, approved: bool = True) -> ApproveInput:
    return ApproveInput(
        step_id="deploy",
        approved=approved,
        approver="release-manager",
        reason="change ticket CHG-1042",
        arguments_digest=digest,
    )


async def test_nothing_is_deployed_until_the_exact_arguments_are_approved(
    dev_server: WorkflowEnvironment,
    target: RunningTarget,
    worker: Worker,
    tasks: TaskClient,
    database: str,
) -> None:
    workflow_id = await start_deployment(tasks)
    waiting = await wait_for(tasks, workflow_id, awaiting_approval)
    step = waiting.step("deploy")
    other = arguments_digest("start_deployment", {**RELEASE, "version": "9.9.9"})

    with pytest.raises(DecisionRefused, match="approval is for other arguments"):
        await tasks.approve(workflow_id, decision(other))
    # The same approval through the UI's signal is recorded as rejected, nothing more.
    handle = dev_server.client.get_workflow_handle_for(AgentTaskWorkflow.run, workflow_id)
    await handle.signal(AgentTaskWorkflow.approve_signal, decision(other))
    refused = await wait_for(tasks, workflow_id, lambda status: bool(status.decisions))
    await workflow_idle(dev_server.client, workflow_id)  # nothing started, nothing due

    assert refused.state is TaskState.AWAITING_APPROVAL
    assert [(d.accepted, d.via) for d in refused.decisions] == [(False, "signal")]
    assert target.state.writes == [] and deployment_rows(database) == []

    await tasks.approve(workflow_id, decision(step.arguments_digest))
    result = await asyncio.wait_for(tasks.result(workflow_id), timeout=HANG_SECONDS)

    deployment = deployment_id(workflow_id)
    assert result.state is TaskState.SUCCEEDED
    assert result.step("deploy").resource_id == deployment
    assert result.step("deploy").result["fencing_token"] == 1
    assert [d.accepted for d in result.decisions] == [False, True]
    assert result.decisions[1].arguments_digest == step.arguments_digest
    assert writes(target, deployment) == [
        ("prepare", 1, True),
        ("roll_out", 1, True),
        ("verify", 1, True),
        ("activate", 1, True),
    ]
    assert [row[1:4] for row in deployment_rows(database)] == [("succeeded", 1, 4)]


async def test_a_denied_deployment_never_starts(
    dev_server: WorkflowEnvironment,
    target: RunningTarget,
    worker: Worker,
    tasks: TaskClient,
    database: str,
) -> None:
    workflow_id = await start_deployment(tasks)
    waiting = await wait_for(tasks, workflow_id, awaiting_approval)

    await tasks.approve(
        workflow_id, decision(waiting.step("deploy").arguments_digest, approved=False)
    )
    result = await asyncio.wait_for(tasks.result(workflow_id), timeout=HANG_SECONDS)
    await workflow_idle(dev_server.client, workflow_id)  # every attempt has reported back

    assert result.state is TaskState.FAILED
    assert result.step("deploy").state is StepState.DENIED
    assert result.step("deploy").attempts == []
    assert "denied by release-manager" in (result.failure_reason or "")
    assert target.state.writes == [] and deployment_rows(database) == []
