"""The task's public models: its input, its status (query and result) and decisions.

State machine of a step::

    pending ─▶ awaiting_approval ─▶ running ◀──▶ backing_off
                   │ deny               │
                   ▼                    ├─▶ succeeded
                 denied                 ├─▶ failed
                                        └─▶ parked ─ happened ─────▶ succeeded
                                               ├─── did_not_happen ─▶ running
                                               └─── abandon ────────▶ abandoned

The task's state follows its active step: running, awaiting_approval or parked, and
ends succeeded (every step succeeded) or failed (a step failed, was denied or abandoned).
"""

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from onceflow.retry_policy import OutcomeClass, RetryBudget
from onceflow.tools._policy import ToolPolicy

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"


class TaskState(StrEnum):
    """The task's state, also published as the ``OnceflowState`` search attribute."""

    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    PARKED = "parked"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class StepState(StrEnum):
    """Where one step is in its state machine."""

    PENDING = "pending"
    AWAITING_APPROVAL = "awaiting_approval"
    RUNNING = "running"
    BACKING_OFF = "backing_off"
    PARKED = "parked"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DENIED = "denied"
    ABANDONED = "abandoned"


class StepInput(BaseModel):
    """One tool call of the task."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step_id: str = Field(pattern=NAME_PATTERN)
    """Stable id of the step: its position or the agent's call id."""
    tool: str = Field(pattern=NAME_PATTERN)
    arguments: dict[str, Any] = Field(default_factory=dict)


class AgentTaskInput(BaseModel):
    """Everything a task needs: who asked, which tool calls, and how much retrying."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: str = Field(pattern=NAME_PATTERN)
    principal: str = Field(pattern=NAME_PATTERN)
    steps: list[StepInput] = Field(min_length=1, max_length=50)
    budget: RetryBudget | None = None
    """The task's retry budget; None takes ``RetryBudget()``'s defaults."""
    record_outcome: bool = False
    """Write the terminal result back to the boundary's idempotency record (set by the
    gateway), so a repeated request can be answered even if the gateway died."""

    @model_validator(mode="after")
    def _step_ids_are_unique(self) -> "AgentTaskInput":
        step_ids = [step.step_id for step in self.steps]
        if len(set(step_ids)) != len(step_ids):
            raise ValueError("step ids must be unique within a task")
        return self


class AttemptRecord(BaseModel):
    """One attempt at a step, as the workflow recorded it."""

    attempt: int
    outcome: OutcomeClass
    started_at: datetime
    finished_at: datetime
    operator_authorised: bool = False
    """Made because an operator decided the earlier effect did not happen."""
    reason: str | None = None
    evidence: dict[str, str] = Field(default_factory=dict)
    key_generation: int = 1
    """The key generation the attempt sent under (see ``StepStatus.key_generation``)."""
    database_unavailable: bool = False
    """It ended because onceflow's database was unreachable: not charged to the caps."""


class ReconcileDecision(StrEnum):
    """An operator's finding about a parked step's effect."""

    HAPPENED = "happened"
    """The effect exists (give its resource id): the step succeeds with it."""
    DID_NOT_HAPPEN = "did_not_happen"
    """The effect does not exist: one more attempt is authorised."""
    ABANDON = "abandon"
    """Stop here: the step and the task end failed."""


class ApproveInput(BaseModel):
    """A person's approval or denial of a step's exact arguments."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step_id: str = Field(pattern=NAME_PATTERN)
    approved: bool
    approver: str = Field(min_length=1, max_length=128)
    reason: str = Field(min_length=1, max_length=2000)
    arguments_digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    """Digest of the arguments the approver saw; approval for other arguments is refused."""


class ReconcileInput(BaseModel):
    """An operator's reconciliation decision for a parked step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step_id: str = Field(pattern=NAME_PATTERN)
    decision: ReconcileDecision
    operator: str = Field(min_length=1, max_length=128)
    reason: str = Field(min_length=1, max_length=2000)
    resource_id: str | None = Field(default=None, min_length=1, max_length=255)
    """With ``happened``: the id of the effect found (e.g. the PaymentIntent id)."""
    unverified: bool = False
    """With ``happened``: accept ``resource_id`` although the tool's look-up could not
    confirm it (it is kept in the decision record as unverified). Default False: a tool
    whose look-up verifies resource ids refuses an id it cannot confirm."""

    @model_validator(mode="after")
    def _resource_id_goes_with_happened(self) -> "ReconcileInput":
        if self.decision is ReconcileDecision.HAPPENED and self.resource_id is None:
            raise ValueError("decision 'happened' needs the resource id of the effect")
        if self.decision is not ReconcileDecision.HAPPENED and self.resource_id is not None:
            raise ValueError("a resource id goes only with decision 'happened'")
        if self.decision is not ReconcileDecision.HAPPENED and self.unverified:
            raise ValueError("'unverified' goes only with decision 'happened'")
        return self


class DecisionRecord(BaseModel):
    """An operator decision as received, accepted or not."""

    kind: Literal["approve", "reconcile"]
    step_id: str
    decision: str
    operator: str
    reason: str
    at: datetime
    via: Literal["update", "signal"]
    arguments_digest: str
    """Digest of the step's arguments the decision was about."""
    accepted: bool
    rejection: str | None = None
    verified: bool | None = None
    """With ``happened``: True when the tool's look-up confirmed the resource, False when
    it was accepted unverified (the operator said so, or the tool cannot verify ids);
    None for other decisions and for tasks started before decisions were checked."""
    finding: str | None = None
    """What the look-up run to check the decision found (ids, amounts), if one ran."""


class TaskOutcomeInput(BaseModel):
    """The terminal result of a task, for the boundary's idempotency record."""

    workflow_id: str
    status: "TaskStatus"


class DecisionResult(BaseModel):
    """What an accepted decision changed."""

    step_id: str
    step_state: StepState
    message: str


class StepStatus(BaseModel):
    """Everything known about one step."""

    step_id: str
    tool: str
    state: StepState = StepState.PENDING
    arguments: dict[str, Any]
    """The arguments exactly as given, so an approver sees what the digest covers."""
    arguments_digest: str
    attempts: list[AttemptRecord] = Field(default_factory=list)
    resource_id: str | None = None
    result: dict[str, Any] = Field(default_factory=dict)
    failure_reason: str | None = None
    park_reason: str | None = None
    evidence: dict[str, str] = Field(default_factory=dict)
    """Latest correlation ids and reconciliation evidence."""
    reconcile_command: str | None = None
    """While parked: the exact command an operator runs to decide."""
    key_generation: int = 1
    """The generation of the step's derived child keys: raised when an operator decides
    ``did_not_happen`` while the old key can no longer be sent (the provider may have
    forgotten it, or it holds a stored failure). Look-ups search every generation."""


class BudgetStatus(BaseModel):
    """The retry budget as spent so far."""

    budget: RetryBudget
    attempts_used: int
    attempts_left: int
    operator_authorised_attempts: int
    deadline_at: datetime
    """When the deadline passes if nobody waits any more: the start + ``deadline`` +
    ``waited_for_people``."""
    waited_for_people: timedelta = timedelta(0)
    """Time spent awaiting approval or parked so far, which the deadline does not count."""


class TaskStatus(BaseModel):
    """The task as a whole: answered by the ``status`` query and returned at the end."""

    workflow_id: str
    tenant: str
    principal: str
    state: TaskState
    steps: list[StepStatus]
    budget: BudgetStatus
    decisions: list[DecisionRecord] = Field(default_factory=list)
    failure_reason: str | None = None
    policies: dict[str, ToolPolicy] = Field(default_factory=dict)
    """Each tool's policy as pinned when the task started (empty for a task started
    before policies were pinned): what the task decides from, whatever the workers'
    settings are now."""

    def step(self, step_id: str) -> StepStatus:
        """The status of one step; raises ``KeyError`` when the task has no such step."""
        for step in self.steps:
            if step.step_id == step_id:
                return step
        raise KeyError(step_id)


TaskOutcomeInput.model_rebuild()

RECORD_TASK_OUTCOME = "record_task_outcome"
"""Name of the activity that writes a task's terminal result to the boundary's record."""
