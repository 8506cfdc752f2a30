"""A PydanticAI agent running durably in a Temporal workflow (``TemporalDurability``),
its tools onceflow's through ``OnceflowNexusToolset``; a scripted ``FunctionModel``
plays the LLM: it charges, charges the same again under a new tool-call id (a model's
repeat), then reports what it was told.

The caller's process (``caller_process.py``: the client-only virtualenv,
``python -P -m pydantic_ai_caller TASK_QUEUE``): its worker with ``PydanticAIPlugin`` on
the client and ``AgentPlugin(agent)`` on the worker, as PydanticAI's docs build it, and
the same plugins replaying its histories when it stops.
"""

import asyncio
import json
import sys
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.durable_exec.temporal import AgentPlugin, PydanticAIPlugin, TemporalDurability
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from caller_process import CATALOGUE, PYDANTIC_AI_ENDPOINT, serve_then_replay
    from onceflow_client.pydantic_ai_temporal import OnceflowNexusToolset


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Charge (the prompt is the charge's arguments), charge the same again, report."""
    [prompt] = [
        part.content
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart)
    ]
    told: list[Any] = [
        part.content
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]
    if len(told) < 2:
        call_id = "call_first" if not told else "call_repeat"
        arguments = json.loads(str(prompt))
        return ModelResponse(
            parts=[ToolCallPart("charge_payment", arguments, tool_call_id=call_id)]
        )
    return ModelResponse(parts=[TextPart(json.dumps(told))])


agent = Agent(
    FunctionModel(script),
    name="payments_agent",
    toolsets=[OnceflowNexusToolset(CATALOGUE, endpoint=PYDANTIC_AI_ENDPOINT)],
    capabilities=[TemporalDurability()],
)


@workflow.defn
class PaymentsAgentWorkflow:
    __pydantic_ai_agents__ = [agent]

    @workflow.run
    async def run(self, prompt: str) -> str:
        result = await agent.run(prompt)
        return result.output


if __name__ == "__main__":
    sys.exit(
        asyncio.run(
            serve_then_replay(
                sys.argv[1],
                [PaymentsAgentWorkflow],
                client_plugins=[PydanticAIPlugin()],
                worker_plugins=[AgentPlugin(agent)],
                replayer_plugins=[PydanticAIPlugin(), AgentPlugin(agent)],
            )
        )
    )
