"""A PydanticAI agent running durably in a Temporal workflow (``TemporalDurability``),
its tools onceflow's through ``OnceflowNexusToolset``; a scripted ``FunctionModel``
plays the LLM: it charges, charges the same again under a new tool-call id (a model's
repeat), then reports what it was told."""

import json
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.durable_exec.temporal import TemporalDurability
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
    from onceflow_client.pydantic_ai_temporal import OnceflowNexusToolset

ENDPOINT = "onceflow-tools-pydantic-ai"
"""The endpoint the agent's toolset calls (the test points it at its onceflow worker)."""
CATALOGUE = [
    {
        "name": "charge_payment",
        "description": "Charge a customer's saved payment method once per order.",
        "input_schema": {"type": "object"},
    }
]


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
    toolsets=[OnceflowNexusToolset(CATALOGUE, endpoint=ENDPOINT)],
    capabilities=[TemporalDurability()],
)


@workflow.defn
class PaymentsAgentWorkflow:
    __pydantic_ai_agents__ = [agent]

    @workflow.run
    async def run(self, prompt: str) -> str:
        result = await agent.run(prompt)
        return result.output
