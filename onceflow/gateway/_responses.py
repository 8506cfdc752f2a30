"""What the boundary answers about a task or a call.

A task is answered with ``TaskView`` (``onceflow.idempotency``, which stores the same view
for replays); a call of an open task with a ``CallView``. Neither view holds arguments,
so records never retain request bodies. ``Readiness`` is what ``GET /readyz`` reports.
"""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from onceflow.idempotency import TERMINAL_STATUS_CODE, TaskView, task_status_url
from onceflow.workflows.agent_task import ENDED_STEP_STATES
from onceflow.workflows.task_models import CallAnswer, StepState, TaskState

IN_PROGRESS_STATUS_CODE = 202
"""HTTP status of a task still running, awaiting approval or parked: poll its URL; and of
a call of an open task that has not ended (send it again to learn its current state)."""
CREATED_STATUS_CODE = 201
"""HTTP status of a new open task (and of its creation's replays while it is open)."""


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
