"""A deployment worker is paused (SIGSTOP) past its lease while its write is in flight;
another worker process takes over with a newer token and finishes; the first is
resumed (SIGCONT). The target refused the stale write, the local record refused the
stale owner's commit, and there is one deployment, finished under the newer token.

Real ``onceflow worker`` processes configured only through the environment. The
deployment settings are the same on every worker and at admission, as in production: the
admitting client pins the tool's policy (heartbeat and attempt timeouts) into the task,
and the workers' lease follows them.

Nothing here is sized to the machine: each wait is for its event, bounded only against
a hang. The heartbeat timeout (how long Temporal waits for the paused owner) keeps a
margin for a loaded core: a worker reports heartbeats at most every 80% of it.
"""

import asyncio
import os
import signal
import subprocess
from collections.abc import Iterator
from unittest import mock

import pytest
from onceflow_devstack.deploy_target import RunningTarget
from temporalio.testing import WorkflowEnvironment

from onceflow.activities import builtin_tools
from onceflow.configuration import load_configuration
from onceflow.retry_policy import OutcomeClass
from onceflow.task_api import TaskClient
from onceflow.tools.worker import Catalogue
from onceflow.workflows.task_models import ApproveInput, TaskState
from tests.harness import (
    HANG_SECONDS,
    eventually,
    onceflow_command,
    spawn,
    stop,
    wait_for_line,
)

from .conftest import ACCOUNT, deployment_id, deployment_rows, start_deployment, wait_for, writes

DEPLOYMENT_SETTINGS = {
    "ONCEFLOW_DEPLOYMENTS_HEARTBEAT_TIMEOUT": "PT10S",
    "ONCEFLOW_DEPLOYMENTS_LEASE_TTL": "PT2S",
    "ONCEFLOW_DEPLOYMENTS_ATTEMPT_TIMEOUT": "PT1M",
}
"""A short lease, so the paused owner's has lapsed when the next attempt starts, and a
heartbeat timeout after which Temporal gives up on the paused owner."""


@pytest.fixture
def tasks(dev_server: WorkflowEnvironment, task_queue: str) -> TaskClient:
    """Admits tasks as a gateway with the workers' deployment settings would: the task
    carries the policy those settings give."""
    with mock.patch.dict(os.environ, DEPLOYMENT_SETTINGS):
        configuration = load_configuration()
    contracts = tuple(tool.registered_contract for tool in builtin_tools(configuration))
    return TaskClient(dev_server.client, task_queue=task_queue, catalogue=Catalogue(contracts))


@pytest.fixture
def workers(
    dev_server: WorkflowEnvironment, database: str, task_queue: str, target: RunningTarget
) -> Iterator[list[subprocess.Popen[str]]]:
    """Two worker processes writing to the test's target, with the test's deployment
    settings, so a paused worker is replaced within seconds."""
    environment = {
        "TEMPORAL_ADDRESS": dev_server.client.service_client.config.target_host,
        "DATABASE_URL": database,
        "ONCEFLOW_TASK_QUEUE": task_queue,
        "ONCEFLOW_SHUTDOWN_GRACE_SECONDS": "1",
        "DEPLOY_TARGET_URL": target.url,
        "ONCEFLOW_BUILTIN_TOOLS": "start_deployment",
        "ONCEFLOW_DEPLOY_TARGET_ACCOUNT": ACCOUNT,
        **DEPLOYMENT_SETTINGS,
    }
    started = [spawn(onceflow_command("worker"), env=environment) for _ in range(2)]
    yield started
    for process in started:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)  # a paused process cannot stop gracefully
        stop(process)


async def test_a_paused_owner_is_fenced_out_at_the_target_and_in_the_database(
    workers: list[subprocess.Popen[str]],
    target: RunningTarget,
    tasks: TaskClient,
    database: str,
) -> None:
    await asyncio.gather(
        *(asyncio.to_thread(wait_for_line, one, "onceflow worker ready") for one in workers)
    )
    hold = target.state.hold_next("roll_out")  # the first owner's write will sit in flight
    workflow_id = await start_deployment(tasks)
    waiting = await wait_for(tasks, workflow_id, lambda s: s.state is TaskState.AWAITING_APPROVAL)
    await tasks.approve(
        workflow_id,
        ApproveInput(
            step_id="deploy",
            approved=True,
            approver="release-manager",
            reason="change ticket CHG-2077",
            arguments_digest=waiting.step("deploy").arguments_digest,
        ),
    )
    await asyncio.wait_for(hold.arrived.wait(), timeout=HANG_SECONDS)
    assert hold.fencing_token == 1 and hold.owner is not None
    [first] = [one for one in workers if hold.owner.endswith(f":{one.pid}")]
    [second] = [one for one in workers if one is not first]

    os.kill(first.pid, signal.SIGSTOP)
    result = await asyncio.wait_for(tasks.result(workflow_id), timeout=HANG_SECONDS)
    hold.release()  # the paused owner's write finally reaches the target
    deployment = deployment_id(workflow_id)
    await eventually(
        lambda: target.state.refused(deployment),
        what="the target refused the stale owner's write",
        interval=0.02,
    )
    os.kill(first.pid, signal.SIGCONT)
    resumed = await asyncio.to_thread(wait_for_line, first, "fencing token 1 is stale")

    # The task: the paused attempt timed out on its heartbeats, the next one finished.
    step = result.step("deploy")
    assert result.state is TaskState.SUCCEEDED
    assert [attempt.outcome for attempt in step.attempts] == [
        OutcomeClass.UNKNOWN,
        OutcomeClass.SUCCEEDED,
    ]
    assert "Heartbeat timeout" in (step.attempts[0].reason or "")
    assert step.result["fencing_token"] == 2 and step.resource_id == deployment
    assert step.evidence["fencing_token"] == "2" and step.evidence["steps_done"] == "4/4"
    assert step.evidence["lease_owner"].endswith(f":{second.pid}")
    # The target: the stale write was refused; the new owner resumed after "prepare".
    assert writes(target, deployment) == [
        ("prepare", 1, True),
        ("roll_out", 2, True),
        ("verify", 2, True),
        ("activate", 2, True),
        ("roll_out", 1, False),
    ]
    assert target.state.refused(deployment)[0].highest_token == 2
    # The database: one deployment, finished by the second owner; the first owner's
    # local write was refused when it woke up.
    [(row_id, state, token, steps_done, owner)] = deployment_rows(database)
    assert (row_id, state, token, steps_done) == (deployment, "succeeded", 2, 4)
    assert owner.endswith(f":{second.pid}")
    assert any("local write refused" in line for line in resumed)
