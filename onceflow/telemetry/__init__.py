"""Traces, metrics and logs that show every attempt of a task without leaking secrets.

``process_telemetry`` configures all three from the standard ``OTEL_*`` variables at a
process's start and flushes them at its exit; ``tracing_interceptor`` is the Temporal
integration every client carries; ``AttemptAnnotations`` puts onceflow's fields on each
attempt's activity span; ``outbound_call`` and ``boundary_span`` are the spans onceflow
opens itself; ``W3CTraceContext`` carries a trace to another process through a database
row (the email outbox); ``scrub`` removes card numbers and secrets from text, and
``sensitive_locations`` / ``unstorable_locations`` find them (and text PostgreSQL or JSON
cannot hold) in a request's arguments.
"""

from onceflow.telemetry._attempts import AttemptAnnotations, attempt_attributes
from onceflow.telemetry._logging import LOG_FORMAT_VARIABLE, configure_logging, log_fields
from onceflow.telemetry._metrics import (
    OLDEST_PARKED_PRECISION,
    PARKED_QUERY,
    configure_metrics,
    metrics_enabled,
    scan_parked_tasks,
    watch_parked_tasks,
)
from onceflow.telemetry._process import process_telemetry
from onceflow.telemetry._redaction import (
    Finding,
    looks_like_card_number,
    looks_like_secret,
    scrub,
    sensitive_locations,
    unstorable_locations,
)
from onceflow.telemetry._tracing import (
    W3CTraceContext,
    boundary_span,
    configure_tracing,
    current_trace_id,
    outbound_call,
    tracing_interceptor,
)

__all__ = [
    "LOG_FORMAT_VARIABLE",
    "OLDEST_PARKED_PRECISION",
    "PARKED_QUERY",
    "AttemptAnnotations",
    "Finding",
    "W3CTraceContext",
    "attempt_attributes",
    "boundary_span",
    "configure_logging",
    "configure_metrics",
    "configure_tracing",
    "current_trace_id",
    "log_fields",
    "looks_like_card_number",
    "looks_like_secret",
    "metrics_enabled",
    "outbound_call",
    "process_telemetry",
    "scan_parked_tasks",
    "scrub",
    "sensitive_locations",
    "tracing_interceptor",
    "unstorable_locations",
    "watch_parked_tasks",
]
