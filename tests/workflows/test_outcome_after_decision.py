"""A task's outcome record never runs ahead of its history.

The record (``record_task_outcome``, a local activity) is what repeated requests get back.
When a decision Update (a denial, a close) ends the task in the workflow task that
admitted it, that workflow task is not in history until it completes: a worker lost
before then, and a Temporal restart that forgets the Update, would leave a record of an
end the task never reached (seen in a chaos run: a denied deployment recorded ``failed``
while the task still awaited approval). So the record must be written only once the
decision is in history. The recorder here reads the task's history when it runs.
"""

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.activities.idempotency_records import TaskOutcomeResult
from onceflow.task_api import TaskClient
from onceflow.tools.worker import CATALOGUE
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.task_models import (
    RECORD_TASK_OUTCOME,
    AgentTaskInput,
    ApproveInput,
    CallInput,
    OpenTaskOptions,
    OutcomeWriter,
    StepInput,
    TaskOutcomeInput,
    TaskState,
    TaskStatus,
)

from .scripted_tools import Script
from .test_agent_task import wait_until

Handle = WorkflowHandle[AgentTaskWorkflow, TaskStatus]


class HistoryAtRecord:
    """Stands in for the boundary's record: keeps, per task, the decision Updates its
    history held when the outcome was recorded."""

    def __init__(self, env: WorkflowEnvironment) -> None:
        self._env = env
        self.updates_in_history: dict[str, list[str]] = {}

    def activity(self) -> Callable[..., Any]:
        @activity.defn(name=RECORD_TASK_OUTCOME)
        async def record_task_outcome(outcome: TaskOutcomeInput) -> TaskOutcomeResult:
            handle = self._env.client.get_workflow_handle(outcome.workflow_id)
            history = await handle.fetch_history()
            self.updates_in_history[outcome.workflow_id] = [
                event.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
                for event in history.events
                if event.event_type is EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
            ]
            return TaskOutcomeResult(recorded=True)

        return record_task_outcome


@pytest.fixture
async def recorder(
    own_time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script
) -> AsyncIterator[HistoryAtRecord]:
    history_at_record = HistoryAtRecord(own_time_skipping_env)
    async with Worker(
        own_time_skipping_env.client,
        task_queue=task_queue,
        workflows=[AgentTaskWorkflow],
        activities=[*script.activities(), history_at_record.activity()],
    ):
        yield history_at_record


async def test_a_denial_is_in_history_before_the_task_records_that_it_failed(
    own_time_skipping_env: WorkflowEnvironment, task_queue: str, recorder: HistoryAtRecord
) -> None:
    tasks = TaskClient(own_time_skipping_env.client, task_queue=task_queue)
    handle: Handle = await tasks.start(
        AgentTaskInput(
            tenant="acme",
            principal="agent",
            steps=[
                StepInput(
                    step_id="d",
                    tool="scripted_approval",
                    arguments={"label": "deny-me", "amount": 900},
                )
            ],
            outcome_writer=OutcomeWriter.WORKFLOW,
        ),
        workflow_id=f"task-{uuid.uuid4().hex}",
    )
    awaiting = await wait_until(
        own_time_skipping_env, handle, lambda s: s.state is TaskState.AWAITING_APPROVAL
    )
    await handle.execute_update(
        AgentTaskWorkflow.approve,
        ApproveInput(
            step_id="d",
            approved=False,
            approver="cfo",
            reason="not this one",
            arguments_digest=awaiting.step("d").arguments_digest,
        ),
    )
    assert (await handle.result()).state is TaskState.FAILED
    assert recorder.updates_in_history[handle.id] == ["approve"]


async def test_a_close_is_in_history_before_the_task_records_that_it_closed(
    own_time_skipping_env: WorkflowEnvironment,
    task_queue: str,
    script: Script,
    recorder: HistoryAtRecord,
) -> None:
    tasks = TaskClient(own_time_skipping_env.client, task_queue=task_queue)
    handle: Handle = await tasks.start(
        AgentTaskInput(
            tenant="acme",
            principal="agent",
            open=OpenTaskOptions(),
            outcome_writer=OutcomeWriter.WORKFLOW,
        ),
        workflow_id=f"task-{uuid.uuid4().hex}",
    )
    # Sent as TaskClient sends a call: with its tool's policy.
    policy = CATALOGUE.get("scripted_safe").policy()
    call = CallInput(call_id="c1", tool="scripted_safe", arguments={"label": "one"}, policy=policy)
    await handle.execute_update(AgentTaskWorkflow.call, call)
    await handle.execute_update(AgentTaskWorkflow.close)
    assert (await handle.result()).state is TaskState.CLOSED
    assert recorder.updates_in_history[handle.id] == ["call", "close"]
