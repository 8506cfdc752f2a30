"""What the agent frameworks' caller processes (``pydantic_ai_caller.py``,
``openai_agents_caller.py``) and their tests share: the names and lines they agree on, and
the process's life: serve the caller's workflows until SIGTERM, then replay every history
of its queue with the caller's own plugins.

A caller runs in the client-only virtualenv the Makefile makes (``.venv-temporal-agents``):
``python -P -m <caller> TASK_QUEUE`` with ``TEMPORAL_ADDRESS`` in the environment and only
this folder on ``PYTHONPATH``, so it imports temporalio, its framework, the client and this
module: nothing of the server's or of the tests'. It prints ``READY`` once its worker polls;
on SIGTERM it stops the worker, prints ``REPLAYED`` and how many histories it replayed, and
exits 1 if one diverged.

With ``TRACED`` set in its environment, its client and worker carry Temporal's
``TracingInterceptor`` (the one integration onceflow uses too), creating the workflow's
spans even without a parent, and it prints ``SPAN``, the name and the trace id of each span
as it ends: the test follows the trace from there into onceflow's exported spans.
"""

import asyncio
import os
import signal
from collections.abc import Sequence

import temporalio.client
import temporalio.worker
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.worker import Replayer, Worker

READY = "agent caller ready"
REPLAYED = "replayed caller histories:"
TRACED = "AGENT_CALLER_TRACED"
SPAN = "caller span:"

PYDANTIC_AI_ENDPOINT = "onceflow-tools-pydantic-ai"
PYDANTIC_AI_WORKFLOW = "PaymentsAgentWorkflow"
OPENAI_AGENTS_ENDPOINT = "onceflow-tools-openai-agents"
OPENAI_AGENTS_WORKFLOW = "OpenAIPaymentsAgent"
"""Each caller's endpoint (the test points it at its onceflow worker) and its workflow's
name (the test starts it by name)."""
TRACED_OPENAI_AGENTS_ENDPOINT = "onceflow-tools-openai-agents-traced"
TRACED_OPENAI_AGENTS_WORKFLOW = "TracedOpenAIPaymentsAgent"
"""The same agent on an endpoint of its own, for the trace test's onceflow worker: an
endpoint routes to one queue for the whole session."""

CATALOGUE = [
    {
        "name": "charge_payment",
        "description": "Charge a customer's saved payment method once per order.",
        "input_schema": {"type": "object"},
    }
]
"""What ``OnceflowClient.list_tools()`` would have read, kept with the agents' code."""


async def serve_then_replay(
    task_queue: str,
    workflows: Sequence[type],
    *,
    client_plugins: Sequence[temporalio.client.Plugin],
    worker_plugins: Sequence[temporalio.worker.Plugin] = (),
    replayer_plugins: Sequence[temporalio.worker.Plugin],
) -> int:
    """Serve ``workflows`` on ``task_queue`` until SIGTERM, then replay the queue's
    histories; returns the process's exit code."""
    interceptors = [traced()] if os.environ.get(TRACED) else []
    client = await Client.connect(
        os.environ["TEMPORAL_ADDRESS"], plugins=list(client_plugins), interceptors=interceptors
    )
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    async with Worker(
        client, task_queue=task_queue, workflows=list(workflows), plugins=list(worker_plugins)
    ):
        print(READY, flush=True)
        await stopping.wait()
    histories = client.list_workflows(f"TaskQueue = '{task_queue}'").map_histories()
    replayer = Replayer(
        workflows=list(workflows), plugins=list(replayer_plugins), interceptors=interceptors
    )
    replayed, diverged = 0, 0
    async with replayer.workflow_replay_iterator(histories) as replays:
        async for result in replays:
            replayed += 1
            if result.replay_failure is not None:
                diverged += 1
                print(f"diverged: {result.replay_failure!r}", flush=True)
    print(REPLAYED, replayed, flush=True)
    return 1 if diverged else 0


class PrintedSpans(SpanExporter):
    """Prints each span's name and trace id as it ends (the caller's virtualenv has no
    OTLP exporter: the client needs none)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            assert span.context is not None
            print(SPAN, span.name, trace.format_trace_id(span.context.trace_id), flush=True)
        return SpanExportResult.SUCCESS


def traced() -> TracingInterceptor:
    """The caller's tracing: workers inherit its client's interceptor. Without a span
    of the test's, a workflow's spans would need a parent, so they are always created."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(PrintedSpans()))
    return TracingInterceptor(
        provider.get_tracer("agent-caller"), always_create_workflow_spans=True
    )
