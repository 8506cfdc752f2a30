"""Replays a history with a tracing worker's interceptor and collects the spans it emits."""

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import WorkflowHistory
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.worker import Replayer

from onceflow.plugin import OnceflowPlugin
from onceflow.workflows import AgentTaskWorkflow


async def spans_emitted_by_replay(history: WorkflowHistory) -> list[str]:
    """Names of the spans a tracing worker emits while replaying ``history``.

    The tools the history calls must be in the catalogue (the workflow reads contracts).
    """
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # Even told to trace workflows without a parent, a replay must emit nothing.
    tracing = TracingInterceptor(provider.get_tracer("replay"), always_create_workflow_spans=True)
    replayer = Replayer(
        workflows=[],
        plugins=[
            OnceflowPlugin(workflows=[AgentTaskWorkflow], tracing=tracing, strict_sandbox=True)
        ],
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
    provider.shutdown()
    return [span.name for span in exporter.get_finished_spans()]
