"""The listings read a task's end from its close status where the task did not publish it
(since 0.6.0), and its published state only while it runs."""

import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from onceflow.retry_policy import OutcomeClass
from onceflow.task_api import TaskClient
from onceflow.task_api._listing import listed_state
from onceflow.workflows.task_models import AgentTaskInput, StepInput, TaskState
from onceflow.workflows.visibility import TASK_STATE
from tests.harness import eventually, wait_for

from .conftest import scripted_worker
from .scripted_tools import Script

COMPLETED, RUNNING = WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.RUNNING


@pytest.mark.parametrize(
    ("published", "kind", "status", "listed"),
    [
        ("parked", "plan", RUNNING, "parked"),
        ("running", "open", RUNNING, "running"),
        (None, "plan", None, "unknown"),
        # Since 0.6.0: an end the close status says.
        ("running", "plan", COMPLETED, "succeeded"),
        ("running", "open", COMPLETED, "closed"),
        # Ends published by earlier releases (and a failed plan's, still published).
        ("succeeded", "plan", COMPLETED, "succeeded"),
        ("closed", "open", COMPLETED, "closed"),
        ("failed", "plan", COMPLETED, "failed"),
        # Stopped from outside: not what it last published.
        ("parked", "plan", WorkflowExecutionStatus.TERMINATED, "terminated"),
        ("running", "plan", WorkflowExecutionStatus.TIMED_OUT, "timed_out"),
    ],
)
def test_listed_state(
    published: str | None, kind: str, status: WorkflowExecutionStatus | None, listed: str
) -> None:
    assert listed_state(published, kind, status) == listed


async def listed(tasks: TaskClient, state: TaskState, tenant: str) -> dict[str, str]:
    return {task.workflow_id: task.state async for task in tasks.list(state=state, tenant=tenant)}


async def test_tasks_are_listed_by_their_end_and_a_terminated_one_not_as_parked(
    dev_server: WorkflowEnvironment, task_queue: str, script: Script
) -> None:
    async with scripted_worker(dev_server, task_queue, script):
        await listings_follow_the_ends(dev_server, task_queue, script)


async def listings_follow_the_ends(
    dev_server: WorkflowEnvironment, task_queue: str, script: Script
) -> None:
    tasks = TaskClient(dev_server.client, task_queue=task_queue)
    tenant = f"listing-{uuid.uuid4().hex[:8]}"

    def plan(label: str) -> AgentTaskInput:
        step = StepInput(step_id="s", tool="scripted_unsafe", arguments={"label": label})
        return AgentTaskInput(tenant=tenant, principal="agent", steps=[step])

    done, stopped = f"done-{uuid.uuid4().hex}", f"stopped-{uuid.uuid4().hex}"
    await tasks.start(plan(script.plan("done", OutcomeClass.SUCCEEDED)), workflow_id=done)
    await tasks.start(plan(script.plan("stuck", OutcomeClass.UNKNOWN)), workflow_id=stopped)
    assert (await tasks.result(done)).state is TaskState.SUCCEEDED
    history = await dev_server.client.get_workflow_handle(done).fetch_history()
    upserts = [
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
        and TASK_STATE.name
        in e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
    ]
    assert upserts == []  # its end is its close status

    await wait_for(tasks, stopped, lambda status: status.state is TaskState.PARKED)
    await eventually(
        lambda: listed(tasks, TaskState.PARKED, tenant),
        until=lambda found: found == {stopped: "parked"},
        what="the parked task listed as parked",
    )
    await eventually(
        lambda: listed(tasks, TaskState.SUCCEEDED, tenant),
        until=lambda found: found == {done: "succeeded"},
        what="the task that completed listed as succeeded",
    )
    await dev_server.client.get_workflow_handle(stopped).terminate(reason="listing test")
    await eventually(
        lambda: listed(tasks, TaskState.PARKED, tenant),
        until=lambda found: found == {},
        what="the terminated task no longer listed as parked",
    )
    summary = await tasks.summary(stopped)
    assert summary is not None and summary.state == "terminated"
