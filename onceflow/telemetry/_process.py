"""Telemetry for the life of one onceflow process: configured at start, flushed at exit."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from onceflow.telemetry._logging import configure_logging
from onceflow.telemetry._metrics import NameKeyedMetricsExporter, configure_metrics
from onceflow.telemetry._tracing import configure_tracing


@asynccontextmanager
async def process_telemetry(service_name: str) -> AsyncIterator[None]:
    """Logging, tracing and metrics for ``onceflow worker``, ``gateway``, ``mcp``, ``relay``
    and ``dev``; must be entered before the process builds its first Temporal client.

    On exit the buffered metrics are drained and both providers are shut down, which
    exports what they still hold: spans of a task's last attempt are not lost on SIGTERM.
    """
    configure_logging(service_name)
    tracer_provider = configure_tracing(service_name)
    pipeline = configure_metrics(service_name)
    async with AsyncExitStack() as exits:
        if tracer_provider is not None:
            exits.push_async_callback(asyncio.to_thread, tracer_provider.shutdown)
        if pipeline is not None:
            exits.push_async_callback(asyncio.to_thread, pipeline.meter_provider.shutdown)
            await exits.enter_async_context(
                NameKeyedMetricsExporter(pipeline.buffer, pipeline.meter_provider)
            )
        yield
