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

An open task takes its calls one by one (Update ``call``); it is running, awaiting
approval or parked as its calls are (parked wins), and ends ``closed`` (closed by the
agent, idle, or at its maximum lifetime) once every call has ended, whatever each call's
own outcome.
"""

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)

from onceflow.retry_policy import OutcomeClass, RetryBudget
from onceflow.tools.worker import ToolPolicy

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"
_OUTCOME_FLAGS = {"record_outcome", "starter_records_outcome"}
"""The flags ``AgentTaskInput.outcome_writer`` replaced, still the input's wire form."""

# The task's memo field the workflow reads (the boundary's own: ``onceflow.idempotency``).
TRACE_ID_MEMO = "trace_id"
"""The id of the trace that started the task (set by ``TaskClient``; the workflow names
it in a parked task's details)."""


class TaskState(StrEnum):
    """The task's state, also published as the ``OnceflowState`` search attribute."""

    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    PARKED = "parked"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CLOSED = "closed"
    """An open task that ended: every call ended (see each call's own state)."""

    @property
    def waits_for_people(self) -> bool:
        """Whether the task waits for a person's decision (an approval, a reconciliation):
        it then writes its outcome into its record itself, whoever started it."""
        return self in (TaskState.AWAITING_APPROVAL, TaskState.PARKED)

    @property
    def is_terminal(self) -> bool:
        """Whether a task in this state has ended (its status will not change): a plan
        succeeded or failed, or an open task closed."""
        return self in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CLOSED)


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
    deliberate_repeat: bool = Field(default=False, exclude_if=lambda repeat: not repeat)
    """A second effect identical to an earlier call's, on purpose: the step claims no
    business intent (``ToolContract.intent``), and is recorded as a deliberate repeat.
    Written only when set, so a plain step's input is what an earlier release decodes."""


class OpenTaskOptions(BaseModel):
    """How an open task lives: its calls arrive one by one as the agent's model picks
    them, until the agent closes it, it idles out, or its lifetime ends."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    idle_timeout: timedelta = Field(default=timedelta(minutes=30), gt=timedelta(0))
    """The task closes after this long with no call arriving or ending, once none is
    unfinished."""
    max_lifetime: timedelta = Field(default=timedelta(days=1), gt=timedelta(0))
    """No call is accepted after this long; the task closes once its calls end."""
    allowed_tools: list[str] | None = None
    """The tools calls may use (the principal's); None: any catalogued tool."""
    calls_per_run: int | None = Field(default=None, ge=1)
    """Continue as new after this many calls in one workflow run, besides whenever
    Temporal suggests it; None: only when Temporal suggests it."""


class TaskMemory(BaseModel):
    """What a task knows that outlives one workflow run, held as one object.

    The workflow keeps these fields here and nowhere else; an open task that continues as
    new carries the object whole (``for_next_run``), so a field added here survives
    continue-as-new with no other edit. What a run keeps beside it is that run's own
    (timers, calls being checked, the live state), rebuilt by the next run.
    """

    model_config = ConfigDict(extra="forbid")

    started_at: datetime
    last_call_at: datetime
    """When the task took its last call (its creation, before any): the idle timer's base."""
    budgeted_attempts: int = 0
    """Attempts that spent the task's budget (retries; in a plan, every attempt)."""
    operator_authorised_attempts: int = 0
    waited_for_people: timedelta = timedelta(0)
    """Time off the task's clock, not machine budget: awaiting approval, parked, or
    waiting for a provider to recover (the name is from before provider waits)."""
    calls: dict[str, "StepStatus"] = Field(default_factory=dict)
    """Every step or call by id, in arrival order; carried without its attempts' details
    (the earlier runs' history keeps those). A list on the wire, as it always was."""
    order: list[str] = Field(default_factory=list)
    """Call ids in arrival order, repeats included."""
    repeat_of: dict[str, str] = Field(default_factory=dict)
    """A repeated call's id -> the earlier identical call that answers it."""
    decisions: list["DecisionRecord"] = Field(default_factory=list)
    policies: dict[str, ToolPolicy] = Field(default_factory=dict)
    runs: int = 1
    """Workflow runs so far, this one included."""

    @field_validator("calls", mode="before")
    @classmethod
    def _calls_by_id(cls, calls: Any) -> Any:
        if isinstance(calls, list):
            return {
                (call.step_id if isinstance(call, StepStatus) else call["step_id"]): call
                for call in calls
            }
        return calls

    @field_serializer("calls")
    def _calls_as_list(self, calls: dict[str, "StepStatus"]) -> list["StepStatus"]:
        return list(calls.values())

    def for_next_run(self) -> "TaskMemory":
        """The memory a continued run starts from: everything, each call without its
        attempts, evidence and arguments."""
        return self.model_copy(
            update={
                "calls": {
                    call_id: call.model_copy(
                        update={"attempts": [], "evidence": {}, "arguments": {}}
                    )
                    for call_id, call in self.calls.items()
                }
            }
        )


class OutcomeWriter(StrEnum):
    """Who writes a task's outcome into the boundary's idempotency record, beside the next
    repeat of its request and the upkeep pass, which repair what a dead writer left (the
    four writers and why each exists: ``onceflow.idempotency``)."""

    NONE = "none"
    """No record names the task (started by hand, not through the gateway)."""
    WORKFLOW = "workflow"
    """The workflow writes it as it ends: nobody waits for its end (an open task)."""
    STARTER = "starter"
    """The request that started it awaits its result and writes it; the workflow writes
    it only once the task asked people or its starter stopped waiting (a 202)."""


class AgentTaskInput(BaseModel):
    """Everything a task needs: who asked, which tool calls, and how much retrying."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: str = Field(pattern=NAME_PATTERN)
    principal: str = Field(pattern=NAME_PATTERN)
    steps: list[StepInput] = Field(default_factory=list, max_length=50)
    """A plan's tool calls, in order (at least one); empty for an open task."""
    budget: RetryBudget | None = None
    """The task's retry budget; None takes ``RetryBudget()``'s defaults."""
    outcome_writer: OutcomeWriter = OutcomeWriter.NONE
    """Who writes the task's outcome into the boundary's idempotency record (set by the
    gateway; the rules: ``onceflow.idempotency``). Default ``none``: no record names the
    task. In history as the two flags it replaced (``_as_the_previous_release_reads``)."""
    started_with_attributes: bool = False
    """The starter set the task's search attributes (state, and a plan's tools) with the
    start (``TaskClient``), so the first workflow task upserts none (an open task's since
    0.4.0, patch ``OPEN_TASK_FEWER_ACTIONS``)."""

    ends_by_close_status: bool = False
    """A task that ends as it ran (a plan succeeded, an open task closed) publishes no
    final state: its close status, Completed, says it (set by ``TaskClient`` since 0.6.0;
    the listings read it so, ``onceflow.task_api``). A billable action and a visibility
    write less per task. A failed plan still publishes ``failed``, which Completed does
    not say."""

    open: OpenTaskOptions | None = None
    """Set for an open task: no steps up front, one Update ``call`` per tool call."""
    carried: TaskMemory | None = None
    """Only in a continued open task: what its earlier runs did."""
    policies: dict[str, ToolPolicy] | None = None
    """A plan's tools' policies, resolved by the process that admitted it (``TaskClient``
    fills them in from its catalogue) and read from history by every replay. None: the
    task pins them on its first workflow task (local activity ``pin_task_policy``).
    Default None."""

    def plan_tools(self) -> list[str]:
        """The plan's tools, each once, sorted (the ``OnceflowTools`` attribute)."""
        return sorted({step.tool for step in self.steps})

    @model_validator(mode="before")
    @classmethod
    def _outcome_writer_from_flags(cls, data: Any) -> Any:
        """Read the two flags ``outcome_writer`` replaced, as every task's input still holds
        them (``_as_the_previous_release_reads``); an ``outcome_writer`` given wins.

        Reachable for every task until the flags stop being written, then for inputs
        written before: remove once no task whose input holds them is open (an open task's
        continued runs carry its input).
        """
        if not isinstance(data, dict) or not _OUTCOME_FLAGS & data.keys():
            return data
        data = dict(data)
        records = data.pop("record_outcome", False)
        by_starter = data.pop("starter_records_outcome", False)
        if "outcome_writer" not in data:
            data["outcome_writer"] = (
                OutcomeWriter.NONE
                if not records
                else OutcomeWriter.STARTER
                if by_starter
                else OutcomeWriter.WORKFLOW
            )
        return data

    @model_serializer(mode="wrap")
    def _as_the_previous_release_reads(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Write ``outcome_writer`` as the two flags it replaced, in their place, and
        ``ends_by_close_status`` only when set.

        A worker of 0.2.0 or earlier refuses an input with a field it does not know (its
        model forbids extras), and workers are replaced one by one after the gateways
        may already run this release: keep writing the flags until the oldest worker a
        gateway can meet reads ``outcome_writer``, then write the field itself. Likewise
        an input that leaves ``ends_by_close_status`` unset is one 0.5.0 reads.
        """
        data = handler(self)
        if not isinstance(data, dict) or "outcome_writer" not in data:
            return data
        if not self.ends_by_close_status:
            del data["ends_by_close_status"]
        flags = {
            "record_outcome": self.outcome_writer is not OutcomeWriter.NONE,
            "starter_records_outcome": self.outcome_writer is OutcomeWriter.STARTER,
        }
        return {
            name: value
            for key, field_value in data.items()
            for name, value in (flags.items() if key == "outcome_writer" else [(key, field_value)])
        }

    @model_validator(mode="after")
    def _step_ids_are_unique(self) -> "AgentTaskInput":
        step_ids = [step.step_id for step in self.steps]
        if len(set(step_ids)) != len(step_ids):
            raise ValueError("step ids must be unique within a task")
        if self.open is None and not step_ids:
            raise ValueError("a task needs at least one step (or open options)")
        if self.open is not None and step_ids:
            raise ValueError("an open task takes its calls one by one, not as steps")
        return self


class CallInput(BaseModel):
    """One tool call of an open task (Update ``call``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    call_id: str = Field(pattern=NAME_PATTERN)
    """The call's step id, stable across the caller's retries (e.g. the model's tool-call
    id): the same id with the same tool and arguments is the same call."""
    tool: str = Field(pattern=NAME_PATTERN)
    arguments: dict[str, Any] = Field(default_factory=dict)
    deliberate_repeat: bool = False
    """Run even when an earlier call of this task had the same tool and arguments (a
    second identical effect, on purpose); recorded in the call's status."""
    wait_until_ended: bool = False
    """Answer only once the call has ended; by default the answer comes as soon as the
    call ends, parks or awaits approval."""
    policy: ToolPolicy | None = None
    """The tool's policy, resolved by the process that admitted the call (``TaskClient``
    fills it in); the first call of a tool pins it for the task. None: the task pins it
    with the local activity ``pin_task_policy``. Default None."""


class CallAnswer(BaseModel):
    """The answer to a call: the call's status now, and the task's."""

    task_id: str
    task_state: TaskState
    call: "StepStatus"
    repeat_of: str | None = None
    """Set when the repeat guard answered: the earlier identical call, never run again."""


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
    throttled: bool = False
    """The provider answered "not now" (429): nothing done, not charged to the caps."""
    held_by_provider: bool = False
    """Nothing was sent: the provider's budget held it past the step's provider wait
    limit. Not charged to the caps."""

    @property
    def free(self) -> bool:
        """Not charged to the attempt caps: nothing the provider did or failed to do."""
        return self.database_unavailable or self.throttled or self.held_by_provider


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
    confirm it; with ``did_not_happen``: although the look-up's miss does not prove the
    effect absent (an eventually consistent search, a read that failed). Kept in the
    decision record as unverified. Default False: the decision is refused instead. A
    look-up that found the effect refuses ``did_not_happen`` either way."""

    @model_validator(mode="after")
    def _resource_id_goes_with_happened(self) -> "ReconcileInput":
        if self.decision is ReconcileDecision.HAPPENED and self.resource_id is None:
            raise ValueError("decision 'happened' needs the resource id of the effect")
        if self.decision is not ReconcileDecision.HAPPENED and self.resource_id is not None:
            raise ValueError("a resource id goes only with decision 'happened'")
        if self.decision is ReconcileDecision.ABANDON and self.unverified:
            raise ValueError("'unverified' goes only with 'happened' or 'did_not_happen'")
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
    """True when the tool's look-up confirmed the decision (``happened``: the resource;
    ``did_not_happen``: a miss that proves the effect does not exist), False when it was
    accepted unverified (the operator said so, or the tool cannot verify ids); None when
    no look-up checked it (``abandon``, a tool without one)."""
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

    model_config = ConfigDict(use_attribute_docstrings=True)

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
    repeat_of: str | None = None
    """In an open task: the earlier identical call that answers this one (never run)."""
    deliberate_repeat: bool = False
    """In an open task: the caller asked for a second identical effect on purpose."""
    waiting_for_provider: str | None = None
    """While the step waits for its provider (its fleet-wide budget held the attempt:
    paused, throttled, or failing with the retry budget spent): why, naming it."""
    provider_waited: timedelta = timedelta(0)
    """How long the step has waited for its provider so far (not machine time; bounded
    by the tool's ``provider_wait_limit``)."""


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
    """Time off the task's clock so far, which the deadline does not count: awaiting
    approval, parked, or waiting for a provider to recover."""


class TaskStatus(BaseModel):
    """The task as a whole: answered by the ``status`` query and returned at the end."""

    model_config = ConfigDict(use_attribute_docstrings=True)

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
    open: bool = False
    """An open task: calls arrive one by one (``steps`` lists them in arrival order)."""
    closing: str | None = None
    """An open task that takes no more calls: why (closed by the agent, idle, lifetime)."""
    runs: int = 1
    """Workflow runs of an open task so far (it continues as new when long)."""

    def step(self, step_id: str) -> StepStatus:
        """The status of one step; raises ``KeyError`` when the task has no such step."""
        for step in self.steps:
            if step.step_id == step_id:
                return step
        raise KeyError(step_id)


# Complete every model that names one defined after it, here, once: a model left
# incomplete is rebuilt by each ``TypeAdapter`` made for it, and Temporal gives every
# workflow run a payload converter of its own, so each cached task kept a validator and
# serializer of its own for its input (about 40 KiB of a waiting task's memory).
TaskOutcomeInput.model_rebuild()
TaskMemory.model_rebuild()
AgentTaskInput.model_rebuild()
CallAnswer.model_rebuild()

RECORD_TASK_OUTCOME = "record_task_outcome"
"""Name of the activity that writes a task's terminal result to the boundary's record."""
