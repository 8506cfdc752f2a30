"""Test-only tools whose activities end as a script says, to drive the workflow's policy.

They stand in for a provider's far side: the workflow, the Temporal server and the
budget under test are all real.
"""

from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict
from temporalio import activity

from onceflow.retry_policy import OutcomeClass
from onceflow.tools import (
    CATALOGUE,
    ApprovalThreshold,
    DedupeStrategy,
    EffectFlags,
    ToolAttemptResult,
    ToolCallInput,
    ToolContract,
)


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
)
SCRIPTED_CONTRACTS = (SAFE, UNSAFE, NEEDS_APPROVAL, PROVIDER_KEYED)


def register_scripted_tools() -> None:
    """Put the scripted tools in the shared catalogue (once per process)."""
    for contract in SCRIPTED_CONTRACTS:
        if contract.name not in CATALOGUE:
            CATALOGUE.register(contract)


class Script:
    """Outcomes per label, consumed in order; the last one repeats forever."""

    def __init__(self) -> None:
        self._outcomes: dict[str, list[OutcomeClass]] = {}
        self.calls: dict[str, list[ToolCallInput]] = defaultdict(list)

    def plan(self, label: str, *outcomes: OutcomeClass) -> str:
        self._outcomes[label] = list(outcomes)
        return label

    def attempts(self, label: str) -> int:
        return len(self.calls[label])

    def activities(self) -> list[Callable[..., Any]]:
        return [self._activity(contract.name) for contract in SCRIPTED_CONTRACTS]

    def _activity(self, name: str) -> Callable[..., Any]:
        @activity.defn(name=name)
        async def perform(call: ToolCallInput) -> ToolAttemptResult:
            label = ScriptedInput.model_validate(call.arguments).label
            self.calls[label].append(call)
            planned = self._outcomes.get(label) or [OutcomeClass.SUCCEEDED]
            outcome = planned.pop(0) if len(planned) > 1 else planned[0]
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
