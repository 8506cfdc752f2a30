"""A tool whose far side answers after a while, for the fairness benchmark: each attempt
takes ``BENCH_SLOW_CALL_SECONDS`` (default 0.3), as a remote call's latency would.

Loaded by ``onceflow worker`` as a custom tool: ``ONCEFLOW_TOOLS=bench._slow_tool:SLOW_TOOL``.
"""

import asyncio
import os
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

SECONDS_VARIABLE = "BENCH_SLOW_CALL_SECONDS"
"""How long the far side takes to answer, read by the worker's process."""


class SlowCallInput(BaseModel):
    """Which task calls: it makes every call's arguments new."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reference: str


async def slow_call(call: ToolCall[SlowCallInput]) -> ToolAttemptResult:
    """Succeed once the far side has answered."""
    await asyncio.sleep(float(os.environ.get(SECONDS_VARIABLE, "0.3")))  # the far side's latency
    return ToolAttemptResult(outcome=OutcomeClass.SUCCEEDED, resource_id=call.args.reference)


SLOW_TOOL = Tool(
    contract=ToolContract(
        name="bench_slow_call",
        description="A call whose far side answers after a while (benchmark only).",
        input_model=SlowCallInput,
        effects=EffectFlags(read_only=True, open_world=False),
        dedupe=DedupeStrategy.NONE,
        start_to_close_timeout=timedelta(seconds=30),
    ),
    perform=slow_call,
)
