"""Deployments on real servers: the local deployment target over HTTP, the Temporal dev
server and PostgreSQL. Assertions read the target's record of every write."""

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from onceflow_devstack.deploy_target import RunningTarget, running_deploy_target
from psycopg_pool import AsyncConnectionPool
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.deployments import DeployTargetSettings, HttpDeployTarget, open_deploy_target
from onceflow.retry_policy import RetryBudget
from onceflow.settings import OnceflowSettings
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient
from onceflow.tools.worker import derive_child_key, derive_task_workflow_id
from onceflow.worker import build_worker
from onceflow.workflows.task_models import AgentTaskInput, StepInput
from tests.harness import wait_for  # noqa: F401 - re-exported for the tests
from tests.tool_configuration import builtin

TENANT = "acme"
ACCOUNT = "target-test"
RELEASE: dict[str, Any] = {"service": "checkout", "version": "2.4.1", "environment": "production"}
FAST_BUDGET = RetryBudget(
    max_attempts_per_task=6,
    max_attempts_per_step=3,
    initial_backoff=timedelta(milliseconds=50),
    max_backoff=timedelta(milliseconds=200),
    deadline=timedelta(minutes=2),
)


@pytest.fixture
async def target() -> AsyncIterator[RunningTarget]:
    """A fresh deployment target on an ephemeral port, 50 ms of work per step."""
    async with running_deploy_target(step_seconds=0.05) as running:
        yield running


@pytest.fixture
def target_settings(target: RunningTarget) -> DeployTargetSettings:
    """A worker's settings for the test's target."""
    return DeployTargetSettings(
        url=target.url, account=ACCOUNT, request_timeout=timedelta(seconds=30)
    )


@pytest.fixture
async def deploy_client(
    target_settings: DeployTargetSettings,
) -> AsyncIterator[HttpDeployTarget]:
    async with open_deploy_target(target_settings) as opened:
        assert opened is not None
        yield opened


@pytest.fixture
async def pool(database: str) -> AsyncIterator[AsyncConnectionPool]:
    async with build_pool(database) as opened:
        yield opened


@pytest.fixture
async def worker(
    dev_server: WorkflowEnvironment,
    pool: AsyncConnectionPool,
    target_settings: DeployTargetSettings,
    task_queue: str,
) -> AsyncIterator[Worker]:
    """A worker serving the built-in tools, ``start_deployment`` opening its own client to
    the test's target."""
    async with build_worker(
        dev_server.client,
        pool,
        OnceflowSettings(task_queue=task_queue, shutdown_grace_seconds=1),
        tools=builtin(deploy_target=target_settings),
    ) as running:
        yield running


@pytest.fixture
def tasks(dev_server: WorkflowEnvironment, task_queue: str) -> TaskClient:
    return TaskClient(dev_server.client, task_queue=task_queue)


async def start_deployment(tasks: TaskClient, arguments: dict[str, Any] = RELEASE) -> str:
    """Start a one-step ``start_deployment`` task (step ``deploy``); returns its id."""
    task = AgentTaskInput(
        tenant=TENANT,
        principal="release-agent",
        steps=[StepInput(step_id="deploy", tool="start_deployment", arguments=arguments)],
        budget=FAST_BUDGET,
    )
    workflow_id = derive_task_workflow_id(
        tenant=TENANT, scope="task", idempotency_key=f"deploy-{uuid.uuid4().hex}"
    )
    await tasks.start(task, workflow_id=workflow_id)
    return workflow_id


def deployment_id(workflow_id: str) -> str:
    return derive_child_key(
        tenant=TENANT,
        workflow_id=workflow_id,
        step_id="deploy",
        child_op="deploy",
        provider_account=ACCOUNT,
    )


def deployment_rows(database: str) -> list[tuple[Any, ...]]:
    """``(deployment_id, state, fencing_token, steps_done, owner)`` of every deployment."""
    with psycopg.connect(database) as conn:
        return conn.execute(
            "SELECT deployment_id, state, fencing_token, steps_done, owner FROM deployments"
        ).fetchall()


def writes(target: RunningTarget, deployment: str) -> list[tuple[str, int, bool]]:
    """``(step, token, applied)`` of every write the target received, in order."""
    return [
        (write.step, write.fencing_token, write.applied)
        for write in target.state.writes
        if write.deployment_id == deployment
    ]
