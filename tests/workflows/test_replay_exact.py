"""A task decides on replay exactly as it did live, whichever workflow task a local
activity's result arrived in.

Live, a local activity's result can come one workflow task after the one that started it
(here: the pin outlasts the workflow task's heartbeat, as it does when a query was
buffered on the task's first workflow task); on replay Core resolves it from its marker
inside the first. A time read right after it would differ, and so would every deadline
counted from it.
"""

import asyncio
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.tools import PIN_TASK_POLICY, PinPolicyInput, PolicyPinning, TaskPolicy
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.task_models import AgentTaskInput, StepInput, TaskState

from .scripted_tools import PROVIDER_KEYED, Script

SLOW_PIN = timedelta(seconds=1.5)
"""Longer than the task's workflow task timeout (1 s): Core heartbeats the first workflow
task, and the pin's result arrives in a later one."""


def slow_pin() -> Callable[..., Any]:
    pinning = PolicyPinning()

    @activity.defn(name=PIN_TASK_POLICY)
    async def pin_task_policy(request: PinPolicyInput) -> TaskPolicy:
        await asyncio.sleep(SLOW_PIN.total_seconds())  # scenario: the pin outlasts a task
        return await pinning.pin_task_policy(request)

    return pin_task_policy


async def test_a_pin_answered_a_workflow_task_late_replays_the_same_attempt_times(
    dev_server: WorkflowEnvironment, task_queue: str, script: Script
) -> None:
    activities = [a for a in script.activities() if a is not None][:-1]
    label = script.plan("late-pin")
    task = AgentTaskInput(
        tenant="acme",
        principal="agent-1",
        steps=[StepInput(step_id="pay", tool=PROVIDER_KEYED.name, arguments={"label": label})],
    )
    workflow_id = f"late-pin-{uuid.uuid4().hex}"
    handle = await dev_server.client.start_workflow(
        AgentTaskWorkflow.run,
        task,
        id=workflow_id,
        task_queue=task_queue,
    )
    asked = asyncio.create_task(handle.query(AgentTaskWorkflow.status))
    await asyncio.sleep(1)
    async with Worker(
        dev_server.client,
        task_queue=task_queue,
        workflows=[AgentTaskWorkflow],
        activities=[*activities, PolicyPinning().pin_task_policy],
    ):
        live = await handle.result()
        print("query answered", (await asked).state)
    assert live.state is TaskState.SUCCEEDED
    history = await handle.fetch_history()
    for event in history.events:
        print(event.event_id, event.event_time.ToDatetime(), event.WhichOneof("attributes"))
    async with Worker(
        dev_server.client,
        task_queue=task_queue,
        workflows=[AgentTaskWorkflow],
        activities=[*activities, slow_pin()],
        max_cached_workflows=0,
    ):
        # The task has ended: the query replays its whole history on this worker.
        replayed = await handle.query(AgentTaskWorkflow.status)
    print(live.step("pay").attempts[0].started_at, replayed.step("pay").attempts[0].started_at)
    assert replayed.step("pay").attempts == live.step("pay").attempts
