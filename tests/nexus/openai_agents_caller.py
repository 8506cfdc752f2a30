"""An OpenAI Agents SDK agent running as a Temporal workflow (``OpenAIAgentsPlugin``), its
tools onceflow's through ``onceflow_nexus_tools``; a scripted model plays the LLM: it
charges, charges the same again under a new tool-call id (a model's repeat), then reports
what it was told.

It runs in the virtualenv of its own the Makefile makes (``.venv-openai-agents-temporal``:
the client with its ``openai-agents-temporal`` extra, nothing of the server):
``python -m tests.nexus.openai_agents_caller TASK_QUEUE`` (``TEMPORAL_ADDRESS`` in the
environment) prints ``CALLER_READY`` once its worker polls. On SIGTERM it stops the worker,
replays every history of its queue with its own plugin, prints ``REPLAYED`` and how many,
and exits 1 if one diverged.
"""

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Replayer, Worker

with workflow.unsafe.imports_passed_through():
    from agents import Agent, Model, ModelResponse, Runner
    from onceflow_client.openai_agents_temporal import onceflow_nexus_tools
    from temporalio.contrib.openai_agents import OpenAIAgentsPlugin
    from temporalio.contrib.openai_agents.testing import ResponseBuilders, TestModelProvider

CALLER_READY = "openai agents caller ready"
REPLAYED = "replayed caller histories:"
ENDPOINT = "onceflow-tools-openai-agents"
"""The endpoint the agent's tools call (the test points it at its onceflow worker)."""
CATALOGUE = [
    {
        "name": "charge_payment",
        "description": "Charge a customer's saved payment method once per order.",
        "input_schema": {"type": "object"},
    }
]

agent: Agent[None] = Agent(
    name="payments_agent",
    instructions="Charge the order, then report what you were told.",
    tools=list(onceflow_nexus_tools(CATALOGUE, endpoint=ENDPOINT)),
)


@workflow.defn
class OpenAIPaymentsAgent:
    @workflow.run
    async def run(self, prompt: str) -> str:
        result = await Runner.run(agent, prompt)
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


async def main(task_queue: str) -> int:
    client = await Client.connect(os.environ["TEMPORAL_ADDRESS"], plugins=[plugin()])
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    async with Worker(client, task_queue=task_queue, workflows=[OpenAIPaymentsAgent]):
        print(CALLER_READY, flush=True)
        await stopping.wait()
    histories = client.list_workflows(f"TaskQueue = '{task_queue}'").map_histories()
    replayer = Replayer(workflows=[OpenAIPaymentsAgent], plugins=[plugin()])
    replayed, diverged = 0, 0
    async with replayer.workflow_replay_iterator(histories) as replays:
        async for result in replays:
            replayed += 1
            if result.replay_failure is not None:
                diverged += 1
                print(f"diverged: {result.replay_failure!r}", flush=True)
    print(REPLAYED, replayed, flush=True)
    return 1 if diverged else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1])))
