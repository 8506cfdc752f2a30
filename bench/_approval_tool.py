"""A tool that needs a person's approval before its first attempt, for the Temporal actions
benchmark: each call waits for an ``approve`` decision, then succeeds at once.

Loaded by ``onceflow worker`` as a custom tool:
``ONCEFLOW_TOOLS=bench._approval_tool:APPROVAL_TOOL``.
"""

from datetime import timedelta

from pydantic import BaseModel, ConfigDict

from onceflow.tools import (
    DedupeStrategy,
    EffectFlags,
    OutcomeClass,
    Tool,
    ToolAttemptResult,
    ToolCall,
    ToolContract,
)


class Payout(BaseModel):
    """What the benchmark's tasks ask for."""

    model_config = ConfigDict(extra="forbid")
    reference: str


async def pay_out(call: ToolCall[Payout]) -> ToolAttemptResult:
    """Succeeds: the approval in front of it is what is measured."""
    return ToolAttemptResult(outcome=OutcomeClass.SUCCEEDED, resource_id=call.args.reference)


APPROVAL_TOOL = Tool(
    contract=ToolContract(
        name="bench_approved_payout",
        description="A payout a person approves first (benchmark only).",
        input_model=Payout,
        effects=EffectFlags(),
        dedupe=DedupeStrategy.NONE,
        requires_approval=True,
        start_to_close_timeout=timedelta(seconds=10),
    ),
    perform=pay_out,
)
