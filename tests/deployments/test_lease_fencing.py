"""The deployment activity on its own against the real target and PostgreSQL: a stale
owner is refused by the target and by the local record; a finished deployment is
reported, never redone."""

import asyncio

import psycopg
from onceflow_devstack.deploy_target import RunningTarget
from psycopg_pool import AsyncConnectionPool
from temporalio.testing import ActivityEnvironment

from onceflow.activities import DeploymentActivities
from onceflow.deployments import HttpDeployTarget
from onceflow.retry_policy import OutcomeClass
from onceflow.tools import ToolAttemptResult, ToolCallInput

from .conftest import RELEASE, deployment_id, deployment_rows, writes


def attempt(number: int) -> ToolCallInput:
    return ToolCallInput(
        tenant="acme",
        principal="release-agent",
        workflow_id="wf-fencing",
        step_id="deploy",
        tool="start_deployment",
        arguments=RELEASE,
        attempt=number,
    )


def run(activities: DeploymentActivities, number: int) -> "asyncio.Task[ToolAttemptResult]":
    heartbeats: list[object] = []
    env = ActivityEnvironment()
    env.on_heartbeat = heartbeats.append
    return asyncio.create_task(env.run(activities.start_deployment, attempt(number)))


async def test_a_stale_owner_is_refused_by_the_target_and_by_the_local_commit(
    target: RunningTarget, deploy_client: HttpDeployTarget, pool: AsyncConnectionPool, database: str
) -> None:
    activities = DeploymentActivities(deploy_client, pool)
    deployment = deployment_id("wf-fencing")
    hold = target.state.hold_next("activate")
    first = run(activities, 1)
    await asyncio.wait_for(hold.arrived.wait(), timeout=10)
    # The first owner stalls past its lease (as if paused): the lease lapses.
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("UPDATE deployments SET lease_expires_at = now() - interval '1 second'")

    second = await asyncio.wait_for(run(activities, 2), timeout=10)
    hold.release()
    stale = await asyncio.wait_for(first, timeout=10)
    replay = await asyncio.wait_for(run(activities, 3), timeout=10)

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
    result = await ActivityEnvironment().run(
        DeploymentActivities(None, pool).start_deployment, attempt(1)
    )
    assert result.outcome is OutcomeClass.REJECTED
    assert "DEPLOY_TARGET_URL" in (result.reason or "")
    assert deployment_rows(database) == []
