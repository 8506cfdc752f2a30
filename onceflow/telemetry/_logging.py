"""Log records with the same fields as the spans, as text or JSON, scrubbed of secrets.

``ONCEFLOW_LOG_FORMAT=json`` writes one JSON object per line (for a log pipeline); the
default is one readable line. Either way a record carries the current ``trace_id`` and
``span_id``, onceflow's attempt fields (``extra={"onceflow": {...}}``, the same
``onceflow.*`` names as the span attributes) and Temporal's workflow and activity ids, and
its message passes through ``scrub`` so a card number or an API key that slipped into a
message never reaches the output. Records go to standard error (standard output belongs
to the MCP stdio transport and to JSON command output).
"""

import json
import logging
import os
import re
import sys
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace

from onceflow.telemetry._redaction import scrub

LOG_FORMAT_VARIABLE = "ONCEFLOW_LOG_FORMAT"
"""``json`` or ``text`` (default)."""
_HANDLER_NAME = "onceflow"
_CHATTY = ("httpx", "httpcore", "grpc", "urllib3")
"""Libraries whose INFO lines (one per HTTP request) carry no correlation id: WARNING only."""
_TEMPORAL_EXTRAS = ("temporal_workflow", "temporal_activity")
_HEX_ID = re.compile(r"[0-9a-f]{16}|[0-9a-f]{32}")


def log_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields of a record: trace, onceflow attempt fields, Temporal ids."""
    fields: dict[str, Any] = {}
    onceflow = getattr(record, "onceflow", None)
    if isinstance(onceflow, dict):
        fields.update({str(name): value for name, value in onceflow.items()})
    for extra in _TEMPORAL_EXTRAS:
        value = getattr(record, extra, None)
        if isinstance(value, dict):
            fields.update({f"{extra}.{name}": item for name, item in value.items()})
    scrubbed = {name: _scrubbed(value) for name, value in fields.items()}
    trace_id = getattr(record, "trace_id", None)
    if not trace_id:
        return scrubbed
    ids = {"trace_id": trace_id, "span_id": getattr(record, "span_id", None)}
    # Span-context ids (TraceContextFilter's hex) are ids, as they are in every span;
    # anything else under these names is scrubbed like any field.
    return {
        **{
            name: value if isinstance(value, str) and _HEX_ID.fullmatch(value) else _scrubbed(value)
            for name, value in ids.items()
        },
        **scrubbed,
    }


def _scrubbed(value: Any) -> Any:
    return scrub(value) if isinstance(value, str) else value


class TraceContextFilter(logging.Filter):
    """Stamps each record with the current span's trace and span ids."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = trace.format_trace_id(context.trace_id)
            record.span_id = trace.format_span_id(context.span_id)
        return True


class JsonLogFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message and the structured fields."""

    def __init__(self, service_name: str) -> None:
        super().__init__()
        self._service = service_name

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "service": self._service,
            "logger": record.name,
            "message": scrub(record.getMessage()),
            **log_fields(record),
        }
        if record.exc_info:
            document["exception"] = scrub(self.formatException(record.exc_info))
        return json.dumps(document, default=str, ensure_ascii=False)


class TextLogFormatter(logging.Formatter):
    """``time level logger message`` followed by ``name=value`` fields."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = scrub(super().format(record))
        fields = " ".join(f"{name}={value}" for name, value in log_fields(record).items())
        return f"{line} {fields}" if fields else line


def configure_logging(service_name: str, *, level: int = logging.INFO) -> None:
    """Route every log record through onceflow's formatter on standard error.

    Idempotent: calling it again replaces the handler it installed before.
    """
    json_format = os.environ.get(LOG_FORMAT_VARIABLE, "text").strip().lower() == "json"
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.addFilter(TraceContextFilter())
    handler.setFormatter(JsonLogFormatter(service_name) if json_format else TextLogFormatter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        if existing.get_name() == _HANDLER_NAME:
            root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
    for name in _CHATTY:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
