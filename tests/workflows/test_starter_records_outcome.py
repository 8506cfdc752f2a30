"""A plan task whose starter writes its outcome ends without a write of its own.

The gateway awaits each plan task it starts and writes the outcome into the idempotency
record itself (``OutcomeWriter.STARTER``): the task's last workflow task then holds no
local activity, and its first no upsert (``TaskClient`` sets the plan's attributes with the
start). A task that asked people still writes its own outcome: the request that started it
may have been answered long before its end.
"""

import uuid

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.task_api import TaskClient
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.task_models import (
    AgentTaskInput,
    ApproveInput,
    OutcomeWriter,
    StepInput,
    TaskState,
    TaskStatus,
)
from onceflow.workflows.visibility import TASK_KIND, TASK_STATE, TASK_TOOLS

from .scripted_tools import Script
from .test_agent_task import wait_until

Handle = WorkflowHandle[AgentTaskWorkflow, TaskStatus]


def gateway_task(*steps: StepInput) -> AgentTaskInput:
    """A plan as the gateway starts it."""
    return AgentTaskInput(
        tenant="acme",
        principal="agent",
        steps=list(steps),
        outcome_writer=OutcomeWriter.STARTER,
    )


def recording_worker(env: WorkflowEnvironment, task_queue: str, script: Script) -> Worker:
    """The scripted tools and a stand-in for the record that keeps every outcome written."""
    return Worker(
        env.client,
        task_queue=task_queue,
        workflows=[AgentTaskWorkflow],
        activities=[*script.activities(), script.outcome_recorder()],
    )


async def events(handle: Handle) -> list[EventType.ValueType]:
    return [event.event_type for event in (await handle.fetch_history()).events]


async def test_a_prompt_task_ends_with_no_outcome_write_and_no_upsert(
    own_time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script
) -> None:
    tasks = TaskClient(own_time_skipping_env.client, task_queue=task_queue)
    async with recording_worker(own_time_skipping_env, task_queue, script):
        handle: Handle = await tasks.start(
            gateway_task(StepInput(step_id="s", tool="scripted_safe", arguments={"label": "a"})),
            workflow_id=f"task-{uuid.uuid4().hex}",
        )
        assert (await handle.result()).state is TaskState.SUCCEEDED
        history = await events(handle)
        described = await handle.describe()
    assert script.outcomes == []
    assert EventType.EVENT_TYPE_MARKER_RECORDED not in history
    # No upsert: the start set the tools and "running", and its close status (Completed)
    # says it succeeded, as the task's summary reads it.
    assert EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES not in history
    attributes = described.typed_search_attributes
    assert attributes.get(TASK_TOOLS) == ["scripted_safe"]
    assert attributes.get(TASK_STATE) == TaskState.RUNNING.value
    assert attributes.get(TASK_KIND) == "plan"
    summary = await tasks.summary(handle.id)
    assert summary is not None and summary.state == TaskState.SUCCEEDED.value


async def test_a_task_that_asked_people_writes_its_own_outcome(
    own_time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script
) -> None:
    tasks = TaskClient(own_time_skipping_env.client, task_queue=task_queue)
    async with recording_worker(own_time_skipping_env, task_queue, script):
        handle: Handle = await tasks.start(
            gateway_task(
                StepInput(
                    step_id="r",
                    tool="scripted_approval",
                    arguments={"label": "approve-me", "amount": 900},
                )
            ),
            workflow_id=f"task-{uuid.uuid4().hex}",
        )
        awaiting = await wait_until(
            own_time_skipping_env, handle, lambda s: s.state is TaskState.AWAITING_APPROVAL
        )
        await handle.execute_update(
            AgentTaskWorkflow.approve,
            ApproveInput(
                step_id="r",
                approved=True,
                approver="cfo",
                reason="within budget",
                arguments_digest=awaiting.step("r").arguments_digest,
            ),
        )
        assert (await handle.result()).state is TaskState.SUCCEEDED
    assert [(o.workflow_id, o.status.state) for o in script.outcomes] == [
        (handle.id, TaskState.SUCCEEDED)
    ]
