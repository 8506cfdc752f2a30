"""The deployment activity on its own against the real target and PostgreSQL: a stale
owner is refused by the target and by the local record; a finished deployment is
reported, never redone."""

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
from onceflow_devstack.deploy_target import RunningTarget
from psycopg_pool import AsyncConnectionPool

from onceflow.deployments import (
    DeploymentToolSettings,
    DeployTargetSettings,
    HttpDeployTarget,
    deployment_tools,
)
from onceflow.retry_policy import OutcomeClass
from onceflow.storage._schema import MIGRATIONS
from onceflow.tools import ToolAttemptResult
from onceflow.tools.worker import ToolCallInput, tool_activities
from tests.harness import HANG_SECONDS, attempt_environment

from .conftest import RELEASE, deployment_id, deployment_rows, writes

Activity = Callable[..., Any]


def attempt(number: int) -> ToolCallInput:
    return ToolCallInput(
        tenant="acme",
        principal="release-agent",
        workflow_id="wf-fencing",
        step_id="deploy",
        tool="start_deployment",
        arguments=RELEASE,
        attempt=number,
        policy=deployment_tools(DeploymentToolSettings(), DeployTargetSettings())[
            0
        ].registered_contract.policy(),
    )


def start_deployment(pool: AsyncConnectionPool, client: HttpDeployTarget | None) -> Activity:
    """The ``start_deployment`` activity as a worker registers it, bound to ``client``."""
    [tool] = deployment_tools(DeploymentToolSettings(), DeployTargetSettings())
    [perform] = tool_activities(tool, pool, client)
    return perform


def run(perform: Activity, number: int) -> "asyncio.Task[ToolAttemptResult]":
    heartbeats: list[object] = []
    env = attempt_environment()
    env.on_heartbeat = heartbeats.append
    return asyncio.create_task(env.run(perform, attempt(number)))


async def test_a_stale_owner_is_refused_by_the_target_and_by_the_local_commit(
    target: RunningTarget, deploy_client: HttpDeployTarget, pool: AsyncConnectionPool, database: str
) -> None:
    perform = start_deployment(pool, deploy_client)
    deployment = deployment_id("wf-fencing")
    hold = target.state.hold_next("activate")
    first = run(perform, 1)
    await asyncio.wait_for(hold.arrived.wait(), timeout=HANG_SECONDS)
    # The first owner stalls past its lease (as if paused): the lease lapses.
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("UPDATE operations SET lease_expires_at = now() - interval '1 second'")

    second = await asyncio.wait_for(run(perform, 2), timeout=HANG_SECONDS)
    hold.release()
    stale = await asyncio.wait_for(first, timeout=HANG_SECONDS)
    replay = await asyncio.wait_for(run(perform, 3), timeout=HANG_SECONDS)

    assert second.outcome is OutcomeClass.SUCCEEDED
    assert second.result["fencing_token"] == 2 and second.result["replayed"] is False
    assert stale.outcome is OutcomeClass.UNKNOWN  # a fenced lease makes a repeat safe
    assert "fencing token 1 is stale (it has seen 2)" in (stale.reason or "")
    assert "local write refused" in (stale.reason or "")
    assert replay.outcome is OutcomeClass.SUCCEEDED and replay.result["replayed"] is True
    assert writes(target, deployment) == [
        ("prepare", 1, True),
        ("roll_out", 1, True),
        ("verify", 1, True),
        ("activate", 2, True),  # the new owner resumed from the recorded progress
        ("activate", 1, False),
    ]
    assert [row[1:4] for row in deployment_rows(database)] == [("succeeded", 2, 4)]


async def test_without_a_target_every_deployment_is_rejected_with_a_reason(
    pool: AsyncConnectionPool, database: str
) -> None:
    result = await attempt_environment().run(start_deployment(pool, None), attempt(1))
    assert result.outcome is OutcomeClass.REJECTED
    assert "DEPLOY_TARGET_URL" in (result.reason or "")
    assert deployment_rows(database) == []


async def test_a_deployment_under_way_before_the_lease_moved_keeps_its_token(
    target: RunningTarget, deploy_client: HttpDeployTarget, pool: AsyncConnectionPool, database: str
) -> None:
    # A row as a worker before migration 7 left it: its lease and token on the row only,
    # two steps done, the owner gone. The migration carries the token to the operation.
    deployment = deployment_id("wf-fencing")
    [upgrade] = [sql for version, _, sql in MIGRATIONS if version == 7]
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO deployments (deployment_id, tenant, workflow_id, step_id, service,"
            " version, environment, state, fencing_token, owner, lease_expires_at, steps_done)"
            " VALUES (%s, 'acme', 'wf-fencing', 'deploy', %s, %s, %s, 'running', 3,"
            " 'deploy#3@old-host:1', now() - interval '1 second', 2)",
            (deployment, RELEASE["service"], RELEASE["version"], RELEASE["environment"]),
        )
        conn.execute(upgrade.encode())

    resumed = await attempt_environment().run(start_deployment(pool, deploy_client), attempt(4))

    assert resumed.outcome is OutcomeClass.SUCCEEDED
    assert resumed.result["fencing_token"] == 4
    assert writes(target, deployment) == [("verify", 4, True), ("activate", 4, True)]
    assert [row[1:4] for row in deployment_rows(database)] == [("succeeded", 4, 4)]
