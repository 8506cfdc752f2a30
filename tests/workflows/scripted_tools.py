"""Test-only tools whose activities end as a script says, to drive the workflow's policy.

They stand in for a provider's far side: the workflow, the Temporal server and the
budget under test are all real.
"""

import asyncio
from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from onceflow.activities.idempotency_records import TaskOutcomeResult
from onceflow.retry_policy import OutcomeClass
from onceflow.tools import (
    ApprovalThreshold,
    DedupeStrategy,
    EffectFlags,
    ToolAttemptResult,
    ToolContract,
)
from onceflow.tools._activities import miss_past_lag
from onceflow.tools.providers import ProviderHealth, ProviderHold
from onceflow.tools.worker import (
    CATALOGUE,
    Catalogue,
    KeyUnusable,
    PolicyPinning,
    ToolCallInput,
    lookup_activity_name,
)
from onceflow.workflows.task_models import RECORD_TASK_OUTCOME, TaskOutcomeInput


class ScriptedInput(BaseModel):
    """``label`` picks the script; ``amount`` drives the approval threshold."""

    model_config = ConfigDict(extra="forbid")
    label: str
    amount: int = 0


def _contract(name: str, dedupe: DedupeStrategy, **extra: Any) -> ToolContract:
    return ToolContract(
        name=name,
        description=f"test tool {name}",
        input_model=ScriptedInput,
        effects=EffectFlags(),
        dedupe=dedupe,
        start_to_close_timeout=timedelta(seconds=10),
        **extra,
    )


SAFE = _contract("scripted_safe", DedupeStrategy.NATURAL_KEY)
UNSAFE = _contract("scripted_unsafe", DedupeStrategy.NONE)
NEEDS_APPROVAL = _contract(
    "scripted_approval",
    DedupeStrategy.NATURAL_KEY,
    requires_approval=True,
    approval_threshold=ApprovalThreshold(argument="amount", above=Decimal(100)),
)
PROVIDER_KEYED = _contract(
    "scripted_provider",
    DedupeStrategy.PROVIDER_IDEMPOTENCY_KEY,
    provider_key_retention=timedelta(hours=24),
    retention_margin=timedelta(hours=1),
    lookup_activity=lookup_activity_name("scripted_provider"),
)
VERIFIED = _contract(
    "scripted_verified",
    DedupeStrategy.PROVIDER_IDEMPOTENCY_KEY,
    provider_key_retention=timedelta(hours=24),
    retention_margin=timedelta(hours=1),
    lookup_activity=lookup_activity_name("scripted_verified"),
    lookup_verifies_resource_ids=True,
)
"""Like ``scripted_provider``, with a look-up that checks an operator's resource id."""
ONCE_ONLY = _contract("scripted_once_only", DedupeStrategy.NATURAL_KEY, deliberate_repeats=False)
"""A tool whose contract forbids deliberate repeats."""
SCRIPTED_CONTRACTS = (SAFE, UNSAFE, NEEDS_APPROVAL, PROVIDER_KEYED, VERIFIED, ONCE_ONLY)


def register_scripted_tools() -> None:
    """Put the scripted tools in the shared catalogue (once per process)."""
    for contract in SCRIPTED_CONTRACTS:
        if contract.name not in CATALOGUE:
            CATALOGUE.register(contract)


DATABASE_DOWN = "database_down"
"""A scripted end: onceflow's database was unreachable (``DatabaseUnavailable``)."""
PROVIDER_HELD = "provider_held"
"""A scripted end: the provider's fleet-wide budget held the attempt (nothing sent)."""
THROTTLED = "throttled"
"""A scripted end: the provider answered 429, "not now" (nothing done)."""
Planned = OutcomeClass | KeyUnusable | str
"""An attempt's scripted end: an outcome, a key no attempt may send under any more
(``SEND_BY_PASSED`` as the tool API reports it, ``STORED_FAILURE`` as a payment tool
does), or ``DATABASE_DOWN``."""


class Script:
    """Outcomes per label, consumed in order; the last one repeats forever. Lookups
    (``scripted_provider`` and ``scripted_verified``) are inconclusive unless ``found``
    names the label; ``scripted_verified``'s confirms an operator's id only when it is
    the one it found, and records any id accepted unverified (in ``recorded``)."""

    def __init__(self) -> None:
        self._outcomes: dict[str, list[Planned]] = {}
        self.calls: dict[str, list[ToolCallInput]] = defaultdict(list)
        self.lookups: dict[str, int] = defaultdict(int)
        self.found: set[str] = set()
        self.lagging: dict[str, timedelta] = {}
        """Labels whose look-up reads an eventually consistent index: its miss proves
        absence only this long after the step's last attempt."""
        self.slow: dict[str, timedelta] = {}
        """Labels whose attempts take this long at the far side (each of them)."""
        self.recorded: dict[str, str] = {}
        self.outcomes: list[TaskOutcomeInput] = []
        self.unrecordable: set[str] = set()
        """Labels whose task's outcome write always fails (the record's database down)."""
        self.rejected: list[ToolCallInput] = []
        """Attempts whose arguments the tool's input model refused: nothing performed."""

    def plan(self, label: str, *outcomes: Planned) -> str:
        self._outcomes[label] = list(outcomes)
        return label

    def attempts(self, label: str) -> int:
        return len(self.calls[label])

    def activities(self, catalogue: Catalogue = CATALOGUE) -> list[Callable[..., Any]]:
        """The scripted tools' activities, their lookup, and the policy pinning a worker
        built by ``build_worker`` registers too, all reading ``catalogue`` (a release's
        contracts; default the process's, where ``register_scripted_tools`` put them)."""
        return [
            *(self._activity(contract.name, catalogue) for contract in SCRIPTED_CONTRACTS),
            self._look_up(PROVIDER_KEYED.name),
            self._look_up(VERIFIED.name),
            PolicyPinning(catalogue).pin_task_policy,
        ]

    def outcome_recorder(self) -> Callable[..., Any]:
        """Stands in for the boundary's record (``record_task_outcome``) where no
        database is: keeps what the task reported in ``outcomes``."""

        @activity.defn(name=RECORD_TASK_OUTCOME)
        async def record_task_outcome(outcome: TaskOutcomeInput) -> TaskOutcomeResult:
            labels = {step.arguments.get("label") for step in outcome.status.steps}
            if labels & self.unrecordable:
                raise ApplicationError("scripted: the record's database is down")
            self.outcomes.append(outcome)
            return TaskOutcomeResult(recorded=True)

        return record_task_outcome

    def _look_up(self, name: str) -> Callable[..., Any]:
        @activity.defn(name=lookup_activity_name(name))
        async def look_up(call: ToolCallInput) -> ToolAttemptResult:
            label = ScriptedInput.model_validate(call.arguments).label
            self.lookups[label] += 1
            claimed = call.claimed_resource_id
            if claimed is not None and call.accept_unverified:
                self.recorded[label] = claimed
                return ToolAttemptResult(
                    outcome=OutcomeClass.SUCCEEDED,
                    resource_id=claimed,
                    result={"label": label, "verified": False},
                )
            if claimed is not None and claimed != f"res-{label}-found":
                return ToolAttemptResult(outcome=OutcomeClass.UNKNOWN, reason="scripted: not it")
            if label in self.found:
                return ToolAttemptResult(
                    outcome=OutcomeClass.SUCCEEDED,
                    resource_id=f"res-{label}-found",
                    result={"label": label, "found_by": "lookup"},
                )
            if label in self.lagging:
                # What a registered look-up's activity wrapper judges: the miss proves
                # absence once the lag has passed since the step's last attempt.
                lag = self.lagging[label]
                return ToolAttemptResult(
                    outcome=OutcomeClass.UNKNOWN,
                    reason="scripted: not in the lagging index",
                    miss_proves_absence=miss_past_lag(call.last_attempt_ended_at, lag),
                    miss_proves_absence_after=lag,
                )
            # The scripted far side is read consistently: not found means not there.
            return ToolAttemptResult(
                outcome=OutcomeClass.UNKNOWN, reason="scripted: not found", miss_proves_absence=True
            )

        return look_up

    def _activity(self, name: str, catalogue: Catalogue) -> Callable[..., Any]:
        @activity.defn(name=name)
        async def perform(call: ToolCallInput) -> ToolAttemptResult:
            try:
                # With the registered contract's model, as every tool's attempt does
                # (onceflow.tools._activities): a release's model, whatever started the task.
                model = catalogue.get(name).input_model
                label = str(model.model_validate(call.arguments).model_dump()["label"])
            except ValidationError:
                self.rejected.append(call)
                return ToolAttemptResult(
                    outcome=OutcomeClass.REJECTED, reason="invalid arguments: scripted"
                )
            self.calls[label].append(call)
            if label in self.slow:
                await asyncio.sleep(self.slow[label].total_seconds())  # scenario: a slow far side
            planned = self._outcomes.get(label) or [OutcomeClass.SUCCEEDED]
            outcome = planned.pop(0) if len(planned) > 1 else planned[0]
            if outcome == PROVIDER_HELD:
                return ToolAttemptResult(
                    outcome=OutcomeClass.TRANSIENT,
                    reason="nothing sent: scripted provider held",
                    provider_hold=ProviderHold(
                        provider="scripted",
                        health=ProviderHealth.SHEDDING_RETRIES,
                        recheck_in=timedelta(seconds=10),
                        reason="waiting for scripted to recover (scripted)",
                    ),
                )
            if outcome == THROTTLED:
                return ToolAttemptResult(
                    outcome=OutcomeClass.TRANSIENT,
                    reason="scripted: 429",
                    throttled_for=timedelta(seconds=2),
                )
            if outcome == DATABASE_DOWN:
                return ToolAttemptResult(
                    outcome=OutcomeClass.TRANSIENT,
                    reason="scripted: onceflow's database is unreachable",
                    database_unavailable=True,
                )
            if isinstance(outcome, KeyUnusable):
                stored = outcome is KeyUnusable.STORED_FAILURE
                return ToolAttemptResult(
                    outcome=OutcomeClass.UNKNOWN if stored else OutcomeClass.TRANSIENT,
                    reason=f"scripted: the key is unusable ({outcome.value})",
                    evidence={"request_id": f"req-{label}-{len(self.calls[label])}"},
                    key_unusable=outcome,
                )
            if outcome is OutcomeClass.SUCCEEDED:
                return ToolAttemptResult(
                    outcome=outcome,
                    resource_id=f"res-{label}-{len(self.calls[label])}",
                    result={"label": label},
                )
            return ToolAttemptResult(
                outcome=outcome,
                reason=f"scripted {outcome.value}",
                evidence={"request_id": f"req-{label}-{len(self.calls[label])}"},
            )

        return perform
