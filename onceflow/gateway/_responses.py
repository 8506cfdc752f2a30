"""What the boundary answers about a task, and what of it is stored for replays.

One shape, ``TaskView``, for every transport and for both the first answer and its
replays: the workflow's ``record_task_outcome`` activity renders the same view the
gateway would, so a replay after a gateway crash is byte-for-byte the first answer.
The view leaves the arguments out, so records never retain request bodies.
"""

from typing import Any

from pydantic import BaseModel, Field

from onceflow.gateway._records import RecordState
from onceflow.workflows.task_models import StepState, TaskState, TaskStatus

TERMINAL_STATUS_CODE = 200
"""HTTP status of a task that ended, succeeded or failed: the call itself completed."""
IN_PROGRESS_STATUS_CODE = 202
"""HTTP status of a task still running, awaiting approval or parked: poll its URL."""


class StepView(BaseModel):
    """One tool call of a task, as the caller sees it."""

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


class TaskView(BaseModel):
    """A task's state and each step's outcome: the body of task answers and replays."""

    task_id: str
    state: TaskState
    steps: list[StepView]
    failure_reason: str | None = None
    status_url: str
    """Where to poll the task (``GET``), relative to the API root."""


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
            )
            for step in status.steps
        ],
        failure_reason=status.failure_reason,
        status_url=task_status_url(status.workflow_id),
    )


def is_terminal(status: TaskStatus) -> bool:
    """Whether the task has ended (its result will not change)."""
    return status.state in (TaskState.SUCCEEDED, TaskState.FAILED)


def stored_outcome(status: TaskStatus) -> tuple[RecordState, int, dict[str, Any], str | None]:
    """What the idempotency record keeps of a finished task: its state, status code,
    body and the last step's resource id."""
    if not is_terminal(status):
        raise ValueError(f"task {status.workflow_id} has not ended (it is {status.state.value})")
    state = RecordState.SUCCEEDED if status.state is TaskState.SUCCEEDED else RecordState.FAILED
    body = task_view(status).model_dump(mode="json")
    resource_id = status.steps[-1].resource_id if status.steps else None
    return state, TERMINAL_STATUS_CODE, body, resource_id
