"""What the idempotency record keeps of an ended task: the caller's view of it.

One shape, ``TaskView``, for every transport and for both the first answer and its
replays: whichever writer stores a task's outcome (``onceflow.idempotency``) renders the
view the gateway answers with, so a replay after a gateway crash is byte-for-byte the
first answer. The view holds no arguments, so records never retain request bodies.
"""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from onceflow.idempotency._store import RecordState
from onceflow.workflows.task_models import StepState, TaskState, TaskStatus

TERMINAL_STATUS_CODE = 200
"""HTTP status of a task that ended, succeeded or failed: the call itself completed."""


class StepView(BaseModel):
    """One tool call of a task, as the caller sees it."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    step_id: str
    tool: str
    state: StepState
    attempts: int
    """Attempts made so far, operator-authorised ones included."""
    resource_id: str | None = None
    """Identity of the effect (coupon issuance, order, payment) once it exists."""
    result: dict[str, Any] = Field(default_factory=dict)
    failure_reason: str | None = None
    park_reason: str | None = None
    waiting_for_provider: str | None = None
    """While the step waits for its provider to let it send (``waiting for stripe to
    recover: …``, paused, throttled): why. Nothing to do: it goes on by itself."""
    repeat_of: str | None = None
    """In an open task: the earlier identical call that answered this one (never run)."""
    deliberate_repeat: bool = False
    """In an open task: the caller asked for a second identical effect on purpose."""


class TaskView(BaseModel):
    """A task's state and each step's outcome: the body of task answers and replays."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    task_id: str
    state: TaskState
    steps: list[StepView]
    """A plan's steps in order; an open task's calls in arrival order, repeats included."""
    failure_reason: str | None = None
    status_url: str
    """Where to poll the task (``GET``), relative to the API root."""
    open: bool = False
    """An open task: calls arrive one by one (``POST /v1/tasks/{id}/calls``)."""
    closing: str | None = None
    """An open task that takes no more calls: why (closed by the agent, idle, lifetime)."""


def task_status_url(workflow_id: str) -> str:
    """The path of a task's status resource."""
    return f"/v1/tasks/{workflow_id}"


def task_view(status: TaskStatus) -> TaskView:
    """The caller's view of a task status."""
    return TaskView(
        task_id=status.workflow_id,
        state=status.state,
        steps=[
            StepView(
                step_id=step.step_id,
                tool=step.tool,
                state=step.state,
                attempts=len(step.attempts),
                resource_id=step.resource_id,
                result=step.result,
                failure_reason=step.failure_reason,
                park_reason=step.park_reason,
                waiting_for_provider=step.waiting_for_provider,
                repeat_of=step.repeat_of,
                deliberate_repeat=step.deliberate_repeat,
            )
            for step in status.steps
        ],
        failure_reason=status.failure_reason,
        status_url=task_status_url(status.workflow_id),
        open=status.open,
        closing=status.closing,
    )


def stored_outcome(status: TaskStatus) -> tuple[RecordState, int, dict[str, Any], str | None]:
    """What the idempotency record keeps of a finished task: its state, status code,
    body and the last step's resource id. A closed open task is stored as succeeded:
    the request that opened it did what it asked (each call's own outcome is listed)."""
    if not status.state.is_terminal:
        raise ValueError(f"task {status.workflow_id} has not ended (it is {status.state.value})")
    state = RecordState.FAILED if status.state is TaskState.FAILED else RecordState.SUCCEEDED
    body = task_view(status).model_dump(mode="json")
    resource_id = status.steps[-1].resource_id if status.steps else None
    return state, TERMINAL_STATUS_CODE, body, resource_id
