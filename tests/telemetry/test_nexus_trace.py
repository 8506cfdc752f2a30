"""One trace from a Temporal agent's tool call to the provider: the caller workflow's Nexus
operation, onceflow's handler and task, the charge's request to Stripe.

The caller (the OpenAI Agents SDK's, ``tests/nexus/openai_agents_caller.py``, in the
client-only virtualenv) runs with Temporal's ``TracingInterceptor`` and prints its spans;
an ``onceflow worker`` process serving the Nexus service exports to the receiver here.
The interceptor carries the trace over the operation's Nexus headers on both sides.
"""

import asyncio
import json
import uuid
from typing import Any

from temporalio.client import WorkflowHandle

from onceflow.nexus import ensure_nexus_endpoint
from tests.harness import wait_for_line
from tests.nexus.caller_process import (
    SPAN,
    TRACED,
    TRACED_OPENAI_AGENTS_ENDPOINT,
    TRACED_OPENAI_AGENTS_WORKFLOW,
)
from tests.nexus.caller_venv import caller_running
from tests.payments.conftest import VISA_CHARGE

from .conftest import ReceivedSpan, TelemetryStack, start_onceflow


async def test_a_temporal_agents_tool_call_is_one_trace_to_the_provider(
    stack: TelemetryStack,
) -> None:
    tenant, _ = await stack.new_agent(tools=("charge_payment",))
    queue = f"otel-nexus-{uuid.uuid4().hex[:10]}"
    await ensure_nexus_endpoint(stack.client, name=TRACED_OPENAI_AGENTS_ENDPOINT, task_queue=queue)
    worker = await start_onceflow(
        "nexus-worker",
        ["worker"],
        {
            **stack.env,
            "ONCEFLOW_TASK_QUEUE": queue,
            "ONCEFLOW_NEXUS_PRINCIPAL": f"{tenant}/agent-1",
        },
        stack.logs_dir / f"{queue}.log",
        "onceflow worker ready",
    )
    caller_queue = f"caller-{queue}"
    try:
        with caller_running(
            "openai_agents_caller",
            caller_queue,
            stack.client.service_client.config.target_host,
            lambda: 1,
            env={TRACED: "1"},
        ) as caller:
            handle: WorkflowHandle[Any, str] = await stack.client.start_workflow(
                TRACED_OPENAI_AGENTS_WORKFLOW,
                json.dumps({**VISA_CHARGE, "order_id": f"ord-{queue}"}),
                id=f"traced-agent-{queue}",
                task_queue=caller_queue,
                result_type=str,
            )
            first, _ = json.loads(await handle.result())
            # The span ended when the operation was scheduled, long before the result.
            lines = await asyncio.to_thread(wait_for_line, caller, f"{SPAN} StartNexusOperation:")
    finally:
        await worker.stop()

    trace_id = lines[-1].split()[-1]
    payment_intent = json.loads(first)["payment_intent"]

    def the_trace(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
        return [span for span in spans if span.trace_id == trace_id]

    def reached_the_provider(spans: list[ReceivedSpan]) -> bool:
        return any(
            span.name == "stripe POST /v1/payment_intents"
            and span.attributes.get("stripe.payment_intent") == payment_intent
            for span in the_trace(spans)
        )

    spans = the_trace(await stack.otlp.wait_for_spans(reached_the_provider))
    names = {span.name for span in spans}
    assert {
        "RunStartNexusOperationHandler:OnceflowTools/call_tool",
        "StartTask",
        "StartWorkflow:AgentTaskWorkflow",
    } <= names, names
    [start_task] = [span for span in spans if span.name == "StartTask"]
    assert start_task.attributes["onceflow.tenant"] == tenant
    assert start_task.attributes["onceflow.nexus_operation"] == "call_tool"
