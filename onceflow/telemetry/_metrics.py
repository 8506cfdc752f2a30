"""Metrics operators page on, exported over OTLP when the ``OTEL_*`` variables ask for it.

Three counters come from the workflow itself, through Temporal's replay-safe
``workflow.metric_meter()`` (a replayed history records nothing):

* ``onceflow_attempts`` (``tool``, ``outcome``): every tool attempt by outcome class;
* ``onceflow_tasks_parked`` (``tool``): every time a task parks for a person;
* ``onceflow_budget_exhausted`` (``tool``, ``then`` = park or fail).

Temporal's runtime hands them (with the SDK's own metrics) to a ``MetricBuffer`` that
``temporalio.contrib.opentelemetry.MetricsExporter`` drains into the OpenTelemetry meter
provider. Two gauges come from a periodic visibility query (``watch_parked_tasks``, run by
workers): ``onceflow_parked_tasks`` (how many tasks wait now) and
``onceflow_oldest_parked_task_age_seconds`` (from the ``OnceflowParkedAt`` attribute).
"""

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from temporalio.client import Client
from temporalio.common import MetricAttributes
from temporalio.contrib.opentelemetry import MetricsExporter
from temporalio.runtime import BufferedMetric, MetricBuffer, Runtime, TelemetryConfig

from onceflow.telemetry._tracing import service_resource
from onceflow.workflows.visibility import TASK_PARKED_AT, TASK_STATE

_log = logging.getLogger(__name__)

PARKED_QUERY = f"WorkflowType = 'AgentTaskWorkflow' AND {TASK_STATE.name} = 'parked'"
"""The visibility query for tasks that wait for a person (also typed into the UI)."""
_BUFFER_SIZE = 10_000


def _exporter() -> MetricExporter | None:
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    chosen = os.environ.get("OTEL_METRICS_EXPORTER", "otlp" if endpoint else "none")
    if chosen.strip().lower() != "otlp" or os.environ.get("OTEL_SDK_DISABLED") == "true":
        return None
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"
    )
    if protocol.startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter()
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
        OTLPMetricExporter as GrpcMetricExporter,
    )

    return GrpcMetricExporter()


@dataclass(frozen=True)
class MetricsPipeline:
    """The meter provider and the buffer Temporal's runtime records into."""

    meter_provider: MeterProvider
    buffer: MetricBuffer


def configure_metrics(service_name: str) -> MetricsPipeline | None:
    """Install a global meter provider exporting over OTLP, if the environment asks for one,
    and make Temporal's default runtime record its metrics into a buffer for it.

    Must run before the process builds its first Temporal client. The export interval is
    ``OTEL_METRIC_EXPORT_INTERVAL`` (default 60 s).

    Returns:
        The pipeline (shut its provider down on exit to flush), or None.
    """
    exporter = _exporter()
    if exporter is None:
        return None
    provider = MeterProvider(
        resource=service_resource(service_name),
        metric_readers=[PeriodicExportingMetricReader(exporter)],
    )
    metrics.set_meter_provider(provider)
    _exporting.append(service_name)
    buffer = MetricBuffer(_BUFFER_SIZE)
    Runtime.set_default(
        Runtime(telemetry=TelemetryConfig(metrics=buffer)), error_if_already_set=False
    )
    return MetricsPipeline(meter_provider=provider, buffer=buffer)


class NameKeyedMetricsExporter(MetricsExporter):
    """Temporal's ``MetricsExporter``, finding instruments by name and reading attributes
    by value.

    The contrib exporter caches instruments and attribute sets by the ``id()`` of objects
    it does not keep alive. A task workflow creates its counters and attribute sets anew
    (``workflow.metric_meter()`` is per workflow), so once a finished workflow's objects
    are freed a new one can reuse an id and be counted under the wrong name or labels.
    OpenTelemetry aggregates by attribute values anyway, so converting each update costs
    little. (Overrides two private methods of the exporter pinned with temporalio 1.35.)
    """

    def __init__(self, buffer: MetricBuffer, meter_provider: MeterProvider) -> None:
        super().__init__(buffer, meter_provider, meter_name="onceflow")
        self._by_name: dict[tuple[str, int], Any] = {}

    def _get_or_create_instrument(self, metric: BufferedMetric) -> Any:
        key = (metric.name, int(metric.kind))
        instrument = self._by_name.get(key)
        if instrument is None:
            self._instruments.clear()  # never look up by a possibly reused id
            instrument = self._by_name[key] = super()._get_or_create_instrument(metric)
            self._instruments.clear()
        return instrument

    def _get_or_create_attributes(self, attributes: MetricAttributes) -> Any:
        return dict(attributes)


@dataclass
class _ParkedTasks:
    count: int | None = None
    oldest_parked_at: datetime | None = None

    def observe_count(self, options: CallbackOptions) -> Iterable[Observation]:
        return [] if self.count is None else [Observation(self.count)]

    def observe_oldest_age(self, options: CallbackOptions) -> Iterable[Observation]:
        if self.count is None:
            return []
        if self.oldest_parked_at is None:
            return [Observation(0.0)]
        age = datetime.now(UTC) - self.oldest_parked_at
        return [Observation(max(age.total_seconds(), 0.0))]


OLDEST_PARKED_PRECISION = 0.01
"""How closely the oldest parked task's age is found: within this share of the age (and
never closer than a second)."""
_OLDEST_SEARCHED = timedelta(days=400)
"""How far back the oldest parked task is searched for; an older one reads as this old."""


async def scan_parked_tasks(
    client: Client, *, query: str = PARKED_QUERY
) -> tuple[int, datetime | None]:
    """How many tasks are parked and when the longest-waiting one parked.

    Counted, never listed: a visibility count is one call however long the backlog, where
    listing read every parked task (a page per thousand) on every scan of every worker.

    Args:
        query: The parked tasks to count. Default all of them (``PARKED_QUERY``).
    """
    count = (await client.count_workflows(query)).count
    if count == 0:
        return 0, None
    oldest = await _oldest_parked_at(client, query)
    # A task that parked before OnceflowParkedAt existed: its start bounds the wait.
    async for execution in client.list_workflows(f"{query} AND {TASK_PARKED_AT.name} IS NULL"):
        if oldest is None or execution.start_time < oldest:
            oldest = execution.start_time
    return count, oldest


async def _oldest_parked_at(client: Client, query: str) -> datetime | None:
    """The earliest ``OnceflowParkedAt`` of the tasks ``query`` finds, to within
    ``OLDEST_PARKED_PRECISION`` of its age: a bisection by counts, as visibility can order
    by a search attribute only on Elasticsearch."""

    async def any_parked_before(moment: datetime) -> bool:
        stamp = moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        counted = await client.count_workflows(f"{query} AND {TASK_PARKED_AT.name} < '{stamp}'")
        return counted.count > 0

    now = datetime.now(UTC)
    # A minute ahead: a task parked by a worker whose clock runs ahead still counts.
    earliest, latest = now - _OLDEST_SEARCHED, now + timedelta(minutes=1)
    if not await any_parked_before(latest):
        return None  # every parked task predates OnceflowParkedAt
    if await any_parked_before(earliest):
        return earliest
    # No parked task before ``earliest``; at least one before ``latest``.
    while latest - earliest > max(timedelta(seconds=1), (now - latest) * OLDEST_PARKED_PRECISION):
        middle = earliest + (latest - earliest) / 2
        if await any_parked_before(middle):
            latest = middle
        else:
            earliest = middle
    return earliest


@contextlib.asynccontextmanager
async def watch_parked_tasks(client: Client, *, every: timedelta) -> AsyncIterator[None]:
    """Publish the parked-task gauges, refreshed by a visibility query every ``every``.

    Does nothing when no meter provider exports (the query would be wasted).
    """
    if not metrics_enabled():
        yield
        return
    state = _ParkedTasks()
    meter = metrics.get_meter("onceflow")
    meter.create_observable_gauge(
        "onceflow_parked_tasks",
        callbacks=[state.observe_count],
        description="Tasks waiting for a reconciliation decision.",
    )
    meter.create_observable_gauge(
        "onceflow_oldest_parked_task_age_seconds",
        callbacks=[state.observe_oldest_age],
        unit="s",
        description="How long the longest-waiting parked task has waited.",
    )

    async def refresh() -> None:
        while True:
            started = time.monotonic()
            try:
                state.count, state.oldest_parked_at = await scan_parked_tasks(client)
            except Exception as error:  # a visibility hiccup must not stop the worker
                _log.warning("could not count parked tasks: %s", type(error).__name__)
            await asyncio.sleep(max(every.total_seconds() - (time.monotonic() - started), 0.1))

    watcher = asyncio.create_task(refresh())
    try:
        yield
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


_exporting: list[str] = []
"""Filled by ``configure_metrics`` once this process has a metrics exporter."""


def metrics_enabled() -> bool:
    """Whether this process exports metrics (``configure_metrics`` found an exporter)."""
    return bool(_exporting)
