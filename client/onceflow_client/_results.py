"""What the gateway answers, as the client hands it to agent code: a task's result and a
call's result, with the states that end them."""

import uuid
from dataclasses import dataclass, field
from typing import Any

ENDED_CALL_STATES = frozenset({"succeeded", "failed", "denied", "abandoned"})
"""States a call of an open task never leaves."""


TERMINAL_STATES = frozenset({"succeeded", "failed", "closed"})


def call_ended(answer: "CallResult") -> bool:
    return answer.ended


def call_settled(answer: "CallResult") -> bool:
    return answer.ended or answer.waiting_for_person


def new_idempotency_key() -> str:
    """A fresh high-entropy key for one logical call (no personal data in it)."""
    return f"ofc-{uuid.uuid4()}"


@dataclass(frozen=True)
class TaskResult:
    """A task as the gateway answered it."""

    task_id: str
    state: str
    body: dict[str, Any] = field(repr=False)
    status_code: int
    replayed: bool
    """True when the answer is the stored result of an earlier request with the key."""

    @property
    def done(self) -> bool:
        """Whether the task has ended (succeeded or failed)."""
        return self.state in TERMINAL_STATES

    @property
    def steps(self) -> list[dict[str, Any]]:
        """Each step's state, resource id and result."""
        steps: list[dict[str, Any]] = self.body.get("steps", [])
        return steps

    @property
    def result(self) -> dict[str, Any]:
        """The last step's result (the tool's result for a tool call)."""
        return self.steps[-1].get("result", {}) if self.steps else {}


@dataclass(frozen=True)
class CallResult:
    """One call of an open task as the gateway answered it.

    A call that has not ``ended`` (parked, awaiting approval, still running) is not its
    final answer: ``OpenTask.wait`` asks again, with the same key, until it ends.
    """

    task_id: str
    step_id: str
    """The call's step id in the task: what an operator's approve or reconcile names."""
    tool: str
    state: str
    """succeeded, failed, denied, abandoned (ended); parked, awaiting_approval, running,
    backing_off, pending (not yet)."""
    body: dict[str, Any] = field(repr=False)
    status_code: int
    replayed: bool
    """True when no new request reached the task for this answer: the stored answer of
    an earlier request with the key, or the call's state asked for again."""
    idempotency_key: str = field(repr=False)
    """The call's key: every retry and every ``wait`` of this call sends it."""
    request: dict[str, Any] = field(repr=False)
    """The call's body as sent, so asking again sends exactly the same call."""

    @property
    def ended(self) -> bool:
        """Whether the call's state is final."""
        return self.state in ENDED_CALL_STATES

    @property
    def succeeded(self) -> bool:
        """Whether the call succeeded (or the earlier call answering it did)."""
        return self.state == "succeeded"

    @property
    def waiting_for_person(self) -> bool:
        """Whether a person must decide first: the call is parked or awaits approval."""
        return self.state in ("parked", "awaiting_approval")

    @property
    def result(self) -> dict[str, Any]:
        """The tool's result once the call succeeded."""
        result: dict[str, Any] = self.body.get("result") or {}
        return result

    @property
    def resource_id(self) -> str | None:
        """Identity of the effect (order, PaymentIntent…) once it exists."""
        value = self.body.get("resource_id")
        return str(value) if value is not None else None

    @property
    def repeat_of(self) -> str | None:
        """Set when the task's repeat guard answered: the earlier identical call, whose
        state and result this is. Nothing ran for this call."""
        value = self.body.get("repeat_of")
        return str(value) if value is not None else None

    @property
    def deliberate_repeat(self) -> bool:
        """Whether the call asked for a second identical effect on purpose."""
        return bool(self.body.get("deliberate_repeat"))

    @property
    def failure_reason(self) -> str | None:
        """Why the call failed, when it did."""
        value = self.body.get("failure_reason")
        return str(value) if value is not None else None

    @property
    def park_reason(self) -> str | None:
        """Why the call is parked, while it is."""
        value = self.body.get("park_reason")
        return str(value) if value is not None else None

    @property
    def task_state(self) -> str:
        """The task's state when the answer was made."""
        return str(self.body.get("task_state", ""))
