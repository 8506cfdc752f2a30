"""What the boundary answers about a task or a call, and what of it is stored for replays.

One shape, ``TaskView``, for every transport and for both the first answer and its
replays: the workflow's ``record_task_outcome`` activity renders the same view the
gateway would, so a replay after a gateway crash is byte-for-byte the first answer.
A call of an open task is answered with a ``CallView``. Neither view holds arguments,
so records never retain request bodies. ``Readiness`` is what ``GET /readyz`` reports.
"""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from onceflow.gateway._records import RecordState
from onceflow.workflows.agent_task import ENDED_STEP_STATES
from onceflow.workflows.task_models import CallAnswer, StepState, TaskState, TaskStatus

TERMINAL_STATUS_CODE = 200
"""HTTP status of a task that ended, succeeded or failed: the call itself completed."""
IN_PROGRESS_STATUS_CODE = 202
"""HTTP status of a task still running, awaiting approval or parked: poll its URL; and of
a call of an open task that has not ended (send it again to learn its current state)."""
CREATED_STATUS_CODE = 201
"""HTTP status of a new open task (and of its creation's replays while it is open)."""


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


class CallView(BaseModel):
    """One call of an open task as its caller sees it: the body of call answers and replays."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    task_id: str
    task_state: TaskState
    """The task's state when the answer was made (running, parked, closed…)."""
    step_id: str
    """The call's step id (its call id): what ``approve`` and ``reconcile`` name."""
    tool: str
    state: StepState
    """succeeded, failed, denied or abandoned: the call has ended (``ended``); parked,
    awaiting_approval, running, backing_off or pending: it has not, send the same
    request again (``?wait=ended`` to wait for its end) to learn its current state."""
    ended: bool
    """Whether ``state`` is final: the answer will not change."""
    attempts: int
    """Attempts the call made (none for a repeat: the earlier call made them)."""
    arguments_digest: str
    """The digest an approval of this call is bound to."""
    resource_id: str | None = None
    """Identity of the effect (coupon issuance, order, PaymentIntent) once it exists."""
    result: dict[str, Any] = Field(default_factory=dict)
    failure_reason: str | None = None
    park_reason: str | None = None
    waiting_for_provider: str | None = None
    """While the call waits for its provider to let it send: why. It goes on by itself."""
    repeat_of: str | None = None
    """Set when the repeat guard answered: the earlier identical call of this task, whose
    state and result this is; nothing ran for this call."""
    deliberate_repeat: bool = False
    """The call asked for a second identical effect on purpose (recorded in the task)."""
    status_url: str
    """The task's status (``GET``), where every call of the task is listed."""


class Readiness(BaseModel):
    """Whether the backends the gateway needs for every request answered just now."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    database: bool
    """PostgreSQL answered a read of the idempotency records."""
    temporal: bool
    """Temporal answered (its frontend and history service)."""

    @property
    def ready(self) -> bool:
        """Whether both answered: the gateway can serve requests."""
        return self.database and self.temporal

    def checks(self) -> dict[str, str]:
        """Each backend's state as ``/readyz`` reports it: ``ok`` or ``unreachable``."""
        return {
            name: "ok" if answered else "unreachable"
            for name, answered in (("database", self.database), ("temporal", self.temporal))
        }


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


def running_view(task_id: str, *, is_open: bool) -> TaskView:
    """The view of a running task whose status is not known here (nothing has happened in
    it yet, or no worker answered its status query): running, no steps listed."""
    return TaskView(
        task_id=task_id,
        state=TaskState.RUNNING,
        steps=[],
        status_url=task_status_url(task_id),
        open=is_open,
    )


def call_view(answer: CallAnswer) -> CallView:
    """The caller's view of an open task's answer to a call."""
    call = answer.call
    return CallView(
        task_id=answer.task_id,
        task_state=answer.task_state,
        step_id=call.step_id,
        tool=call.tool,
        state=call.state,
        ended=call.state in ENDED_STEP_STATES,
        attempts=len(call.attempts),
        arguments_digest=call.arguments_digest,
        resource_id=call.resource_id,
        result=call.result,
        failure_reason=call.failure_reason,
        park_reason=call.park_reason,
        waiting_for_provider=call.waiting_for_provider,
        repeat_of=answer.repeat_of,
        deliberate_repeat=call.deliberate_repeat,
        status_url=task_status_url(answer.task_id),
    )


def call_status_code(view: CallView) -> int:
    """200 for a call that ended (its answer is final), 202 while it has not."""
    return TERMINAL_STATUS_CODE if view.ended else IN_PROGRESS_STATUS_CODE


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
