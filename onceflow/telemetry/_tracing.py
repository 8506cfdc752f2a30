"""OpenTelemetry tracing from the standard ``OTEL_*`` variables, exported over OTLP.

Nothing is exported unless an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) or ``OTEL_TRACES_EXPORTER=otlp`` is set;
``OTEL_EXPORTER_OTLP_PROTOCOL`` picks ``grpc`` (default) or ``http/protobuf``.

One trace per task: the gateway's request span (under FastAPI's HTTP server span), the
``cli.call`` span of ``onceflow call`` or, for a task started elsewhere, the ``StartTask``
span of ``TaskClient.start`` is the ancestor of Temporal's ``StartWorkflow`` span, whose
context travels in the workflow's headers to every workflow and activity span, on every
worker and across worker restarts.
Temporal's ``TracingInterceptor`` is the one integration used (never also the plugin,
which would double the spans): its spans are exported as they happen, so a parked task's
attempts are visible while it waits, and it emits no workflow span while a history is
being replayed. Work another process finishes later (an email the relay delivers) carries
its attempt's context as text (``W3CTraceContext``) in the row that hands it over, and
that process's span continues the task's trace from there.
"""

import functools
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
    TraceState,
)
from opentelemetry.util.types import AttributeValue
from temporalio.contrib.opentelemetry import TracingInterceptor

from onceflow.telemetry._redaction import scrub

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
"""W3C Trace Context version 00, the only version onceflow writes."""
_TRACESTATE_MAX_LENGTH = 512
"""W3C Trace Context: what every platform must propagate; longer ones may be dropped."""


@functools.cache
def _tracer(name: str) -> Tracer:
    """The tracer ``name``, got once per process (not at import, which reads no
    setting): getting one per span built a new one per request (and, under the SDK's
    provider, a new instrumentation scope). Got before a provider is installed, it is
    OpenTelemetry's proxy, which uses the global provider from the moment
    ``configure_tracing`` (or anyone) installs it."""
    return trace.get_tracer(name)


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


@dataclass(frozen=True)
class W3CTraceContext:
    """A span's W3C trace context as text, stored with work another process takes over
    (an outbox row), so that process's span continues the same trace.

    Ids and flags only (``traceparent``), plus the vendors' ``tracestate`` when it is
    valid, at most 512 characters and free of anything ``scrub`` would remove: never a
    secret. Text read back is validated (``parse``); a malformed value is ignored.
    """

    traceparent: str
    """``00-<trace id>-<parent span id>-<flags>``."""
    tracestate: str | None = None
    """The vendors' ``tracestate`` list, when there is one."""

    @classmethod
    def current(cls) -> "W3CTraceContext | None":
        """The current span's context; None outside a trace (nothing to continue)."""
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return None
        traceparent = (
            f"00-{trace.format_trace_id(context.trace_id)}-"
            f"{trace.format_span_id(context.span_id)}-{context.trace_flags:02x}"
        )
        return cls.parse(traceparent, context.trace_state.to_header() or None)

    @classmethod
    def parse(cls, traceparent: object, tracestate: object = None) -> "W3CTraceContext | None":
        """Validate stored text: None for a missing or malformed ``traceparent`` (version
        00, lowercase hex, non-zero ids); a ``tracestate`` that is malformed, too long or
        looks like it holds a secret is dropped."""
        if not isinstance(traceparent, str):
            return None
        match = _TRACEPARENT.fullmatch(traceparent)
        if match is None or int(match[1], 16) == 0 or int(match[2], 16) == 0:
            return None
        return cls(traceparent, _valid_tracestate(tracestate))

    def parent(self) -> Context:
        """A context whose current span is the (remote) span this text names: pass it as
        a new span's parent to continue the trace."""
        _, trace_id, span_id, flags = self.traceparent.split("-")
        span_context = SpanContext(
            trace_id=int(trace_id, 16),
            span_id=int(span_id, 16),
            is_remote=True,
            trace_flags=TraceFlags(int(flags, 16)),
            trace_state=TraceState.from_header([self.tracestate]) if self.tracestate else None,
        )
        return trace.set_span_in_context(NonRecordingSpan(span_context), Context())


def _valid_tracestate(tracestate: object) -> str | None:
    if not isinstance(tracestate, str) or not 0 < len(tracestate) <= _TRACESTATE_MAX_LENGTH:
        return None
    if scrub(tracestate) != tracestate:
        return None
    try:
        # Any member that is not a W3C key=value empties the whole list.
        parsed = TraceState.from_header([tracestate])
    except Exception:
        return None
    return parsed.to_header() or None


@contextmanager
def outbound_call(
    system: str,
    operation: str,
    attributes: dict[str, AttributeValue] | None = None,
    *,
    parent: Context | None = None,
) -> Iterator[Span]:
    """A client span around one call to a far-side service (Stripe, SMTP, a deploy target).

    The caller adds the correlation ids the answer carries. An exception marks the span
    as failed with the exception's type only: messages and tracebacks can quote data.
    ``parent`` (default: the current context) is where a process continuing another's
    work starts (``W3CTraceContext.parent``).
    """
    with _tracer("onceflow.outbound").start_as_current_span(
        f"{system} {operation}",
        context=parent,
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
    and a caller's ``traceparent`` continues the caller's trace; over MCP and for
    ``onceflow call`` (``cli.call <tool>``) it is the root.
    A refusal carrying an HTTP ``status`` below 500 (the boundary's own errors) is the
    client's problem and leaves the span's status unset, as OpenTelemetry's HTTP
    conventions ask of server spans; anything else marks it failed by type only.
    """
    with _tracer("onceflow.gateway").start_as_current_span(
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
