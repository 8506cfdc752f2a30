"""A tool whose far side never answers, for the parked-backlog benchmark: every task that
calls it parks (its outcome is unknown, it has no look-up and repeating is not safe).

Loaded by ``onceflow worker`` as a custom tool: ``ONCEFLOW_TOOLS=bench._parking_tool:PARKING_TOOL``.
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


class Transfer(BaseModel):
    """What the benchmark's tasks ask for."""

    model_config = ConfigDict(extra="forbid")
    reference: str


async def transfer(call: ToolCall[Transfer]) -> ToolAttemptResult:
    """Records the send, then reports what a timed-out request is: an unknown outcome."""
    operation = await call.begin("transfer", provider_account="bench")
    if operation.earlier_success:
        return operation.earlier_success
    return await operation.failed(OutcomeClass.UNKNOWN, "bench: the far side never answered")


PARKING_TOOL = Tool(
    contract=ToolContract(
        name="bench_transfer",
        description="A transfer whose far side never answers (benchmark only).",
        input_model=Transfer,
        effects=EffectFlags(),
        dedupe=DedupeStrategy.NONE,
        start_to_close_timeout=timedelta(seconds=10),
    ),
    perform=transfer,
)
