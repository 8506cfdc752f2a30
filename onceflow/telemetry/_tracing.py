"""OpenTelemetry tracing from the standard ``OTEL_*`` variables, exported over OTLP.

Nothing is exported unless an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) or ``OTEL_TRACES_EXPORTER=otlp`` is set;
``OTEL_EXPORTER_OTLP_PROTOCOL`` picks ``grpc`` (default) or ``http/protobuf``.

One trace per task: the gateway's request span (under FastAPI's HTTP server span; or,
for a task started elsewhere, the ``StartTask`` span of ``TaskClient.start``) is the
ancestor of Temporal's ``StartWorkflow`` span, whose context travels in the workflow's
headers to every workflow and activity span, on every worker and across worker restarts.
Temporal's ``TracingInterceptor`` is the one integration used (never also the plugin,
which would double the spans): its spans are exported as they happen, so a parked task's
attempts are visible while it waits, and it emits no workflow span while a history is
being replayed.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue
from temporalio.contrib.opentelemetry import TracingInterceptor


def _exporter() -> SpanExporter | None:
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    chosen = os.environ.get("OTEL_TRACES_EXPORTER", "otlp" if endpoint else "none")
    if chosen.strip().lower() != "otlp" or os.environ.get("OTEL_SDK_DISABLED") == "true":
        return None
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"
    )
    # Both exporters read the endpoint, headers and timeouts from OTEL_* themselves.
    if protocol.startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcSpanExporter,
    )

    return GrpcSpanExporter()


def service_resource(service_name: str) -> Resource:
    """``service.name`` (``OTEL_SERVICE_NAME`` wins) plus ``OTEL_RESOURCE_ATTRIBUTES``."""
    return Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})


def configure_tracing(service_name: str) -> TracerProvider | None:
    """Install a global tracer provider exporting over OTLP, if the environment asks for one.

    The batch processor's schedule comes from ``OTEL_BSP_*`` (default: every 5 s).

    Args:
        service_name: ``service.name`` unless ``OTEL_SERVICE_NAME`` says otherwise.

    Returns:
        The provider (shut it down on exit to flush), or None when nothing is exported.
    """
    exporter = _exporter()
    if exporter is None:
        return None
    provider = TracerProvider(resource=service_resource(service_name))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def tracing_interceptor() -> TracingInterceptor:
    """Temporal's tracing interceptor, for every client onceflow builds (workers inherit it).

    ``always_create_workflow_spans`` stays off: every onceflow start goes through
    ``TaskClient.start``, which always opens a span, so task workflows always have a
    parent. A workflow started without one (the prune schedule, ``temporal workflow
    start``) would get a new root per workflow task, not one trace, so it gets none.
    """
    return TracingInterceptor()


def current_trace_id() -> str | None:
    """The current span's trace id as 32 hex digits, or None outside a recorded trace."""
    context = trace.get_current_span().get_span_context()
    return trace.format_trace_id(context.trace_id) if context.is_valid else None


@contextmanager
def outbound_call(
    system: str, operation: str, attributes: dict[str, AttributeValue] | None = None
) -> Iterator[Span]:
    """A client span around one call to a far-side service (Stripe, SMTP, a deploy target).

    The caller adds the correlation ids the answer carries. An exception marks the span
    as failed with the exception's type only: messages and tracebacks can quote data.
    """
    tracer = trace.get_tracer("onceflow.outbound")
    with tracer.start_as_current_span(
        f"{system} {operation}",
        kind=SpanKind.CLIENT,
        attributes={"onceflow.provider": system, **(attributes or {})},
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except BaseException as error:
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            raise


@contextmanager
def boundary_span(name: str, attributes: dict[str, AttributeValue]) -> Iterator[Span]:
    """The span of one request at the boundary; a task it starts is its child.

    Internal: over HTTP, FastAPI's own server span (``POST /v1/tasks``) is its parent,
    and a caller's ``traceparent`` continues the caller's trace; over MCP it is the root.
    A refusal carrying an HTTP ``status`` below 500 (the boundary's own errors) is the
    client's problem and leaves the span's status unset, as OpenTelemetry's HTTP
    conventions ask of server spans; anything else marks it failed by type only.
    """
    tracer = trace.get_tracer("onceflow.gateway")
    with tracer.start_as_current_span(
        name,
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except BaseException as error:
            status = getattr(error, "status", 500)
            span.set_attribute("onceflow.refused_with", type(error).__name__)
            if not isinstance(status, int) or status >= 500:
                span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            else:
                span.set_attribute("http.response.status_code", status)
            raise
