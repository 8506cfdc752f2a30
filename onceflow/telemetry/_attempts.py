"""Annotates every tool attempt's activity span with what an operator needs, and no secrets.

The Temporal ``TracingInterceptor`` opens the ``RunActivity`` span; this interceptor runs
inside it and adds onceflow's attributes from the attempt's input and classified result.
Only identifiers are copied: tenant, workflow id, step, attempt, tool, outcome, and the
evidence activities record (key digests and provider correlation ids). Arguments, raw
keys and bodies never reach a span.
"""

import logging
from typing import Any

from opentelemetry import trace
from temporalio import activity
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from onceflow.retry_policy import OutcomeClass
from onceflow.telemetry._redaction import scrub
from onceflow.tools import ToolAttemptResult
from onceflow.tools.worker import ToolCallInput

logger = logging.getLogger("onceflow.attempts")

_PROMOTED_EVIDENCE = {
    "child_key_digest": "onceflow.child_key_digest",
    "request_id": "onceflow.provider_request_id",
}
"""Evidence every tool records under these names, promoted to first-class attributes."""


def attempt_attributes(
    call: ToolCallInput, result: ToolAttemptResult | None
) -> dict[str, str | int]:
    """The span attributes and log fields of one attempt."""
    attributes: dict[str, str | int] = {
        "onceflow.tenant": call.tenant,
        "onceflow.principal": call.principal,
        "onceflow.workflow_id": call.workflow_id,
        "onceflow.step": call.step_id,
        "onceflow.attempt": call.attempt,
        "onceflow.tool": call.tool,
    }
    if result is not None:
        attributes["onceflow.outcome"] = result.outcome.value
        if result.resource_id:
            attributes["onceflow.resource_id"] = result.resource_id
        for name, value in result.evidence.items():
            # Evidence holds ids and digests by convention; scrub anyway, it is cheap.
            attributes[f"onceflow.evidence.{name}"] = scrub(value)
            if name in _PROMOTED_EVIDENCE:
                attributes[_PROMOTED_EVIDENCE[name]] = scrub(value)
    return attributes


class AttemptAnnotations(Interceptor):
    """Worker interceptor: onceflow attributes on tool activity spans, one log line each."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _AnnotatingActivity(next)


class _AnnotatingActivity(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        call = input.args[0] if input.args else None
        if not isinstance(call, ToolCallInput):
            return await super().execute_activity(input)
        span = trace.get_current_span()
        activity_type = activity.info().activity_type
        span.set_attributes(attempt_attributes(call, None))
        try:
            result = await super().execute_activity(input)
        except BaseException as error:
            # The workflow counts an attempt that raised as unknown: say so here too.
            attributes = {
                **attempt_attributes(call, None),
                "onceflow.outcome": OutcomeClass.UNKNOWN.value,
                "onceflow.raised": type(error).__name__,
            }
            span.set_attributes(attributes)
            self._log(call, activity_type, attributes, logging.WARNING)
            raise
        attributes = attempt_attributes(
            call, result if isinstance(result, ToolAttemptResult) else None
        )
        span.set_attributes(attributes)
        self._log(call, activity_type, attributes, logging.INFO)
        return result

    @staticmethod
    def _log(
        call: ToolCallInput, activity_type: str, attributes: dict[str, str | int], level: int
    ) -> None:
        logger.log(
            level,
            "%s of %s step %s attempt %s: %s",
            activity_type,
            call.tool,
            call.step_id,
            call.attempt,
            attributes.get("onceflow.outcome", "no result"),
            extra={"onceflow": {**attributes, "onceflow.activity": activity_type}},
        )
