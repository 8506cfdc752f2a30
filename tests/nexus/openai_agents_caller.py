"""An OpenAI Agents SDK agent running as a Temporal workflow (``OpenAIAgentsPlugin``), its
tools onceflow's through ``onceflow_nexus_tools``; a scripted model plays the LLM: it
charges, charges the same again under a new tool-call id (a model's repeat), then reports
what it was told.

The caller's process (``caller_process.py``: the client-only virtualenv,
``python -P -m openai_agents_caller TASK_QUEUE``): its worker with ``OpenAIAgentsPlugin``
and the scripted model, and the same plugin replaying its histories when it stops.
"""

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agents import Agent, Model, ModelResponse, Runner
    from caller_process import (
        CATALOGUE,
        OPENAI_AGENTS_ENDPOINT,
        TRACED_OPENAI_AGENTS_ENDPOINT,
        serve_then_replay,
    )
    from onceflow_client.openai_agents_temporal import onceflow_nexus_tools
    from temporalio.contrib.openai_agents import OpenAIAgentsPlugin
    from temporalio.contrib.openai_agents.testing import ResponseBuilders, TestModelProvider

agent: Agent[None] = Agent(
    name="payments_agent",
    instructions="Charge the order, then report what you were told.",
    tools=list(onceflow_nexus_tools(CATALOGUE, endpoint=OPENAI_AGENTS_ENDPOINT)),
)


@workflow.defn
class OpenAIPaymentsAgent:
    @workflow.run
    async def run(self, prompt: str) -> str:
        result = await Runner.run(agent, prompt)
        return str(result.final_output)


traced_agent = agent.clone(
    tools=list(onceflow_nexus_tools(CATALOGUE, endpoint=TRACED_OPENAI_AGENTS_ENDPOINT))
)


@workflow.defn
class TracedOpenAIPaymentsAgent:
    """The same agent on the trace test's endpoint."""

    @workflow.run
    async def run(self, prompt: str) -> str:
        result = await Runner.run(traced_agent, prompt)
        return str(result.final_output)


class ScriptedModel(Model):
    """Charge (the prompt is the charge's arguments), charge the same again, report. Built
    like the integration's ``TestModel`` (its ``ResponseBuilders``, served by its
    ``TestModelProvider``) but reading the conversation instead of popping a fixed list,
    so one model serves every run of the worker."""

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        [prompt] = [item["content"] for item in items if item.get("role") == "user"]
        told = [item["output"] for item in items if item.get("type") == "function_call_output"]
        if len(told) < 2:
            call_id = "call_first" if not told else "call_repeat"
            return ResponseBuilders.tool_call(
                str(prompt), "charge_payment", call_id=call_id, item_id=f"fc_{call_id}"
            )
        return ResponseBuilders.output_message(json.dumps(told))

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


def plugin() -> OpenAIAgentsPlugin:
    return OpenAIAgentsPlugin(model_provider=TestModelProvider(ScriptedModel()))


if __name__ == "__main__":
    sys.exit(
        asyncio.run(
            serve_then_replay(
                sys.argv[1],
                [OpenAIPaymentsAgent, TracedOpenAIPaymentsAgent],
                client_plugins=[plugin()],
                replayer_plugins=[plugin()],
            )
        )
    )
