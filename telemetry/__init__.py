"""Traces and logs that show every attempt of a task without leaking keys or secrets."""

from telemetry._attempts import AttemptAnnotations, attempt_attributes
from telemetry._tracing import configure_tracing

__all__ = ["AttemptAnnotations", "attempt_attributes", "configure_tracing"]
