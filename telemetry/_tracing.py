"""OpenTelemetry tracing from the standard ``OTEL_*`` variables, exported over OTLP.

Nothing is exported unless an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) or ``OTEL_TRACES_EXPORTER=otlp`` is set;
``OTEL_EXPORTER_OTLP_PROTOCOL`` picks ``grpc`` (default) or ``http/protobuf``.
"""

import os

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter


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


def configure_tracing(service_name: str) -> TracerProvider | None:
    """Install a global tracer provider exporting over OTLP, if the environment asks for one.

    Args:
        service_name: ``service.name`` unless ``OTEL_SERVICE_NAME`` says otherwise.

    Returns:
        The provider (shut it down on exit to flush), or None when nothing is exported.
    """
    exporter = _exporter()
    if exporter is None:
        return None
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider
