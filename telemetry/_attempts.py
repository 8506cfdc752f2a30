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

from tools import ToolAttemptResult, ToolCallInput

logger = logging.getLogger("onceflow.attempts")


def attempt_attributes(
    call: ToolCallInput, result: ToolAttemptResult | None
) -> dict[str, str | int]:
    """The span attributes and log fields of one attempt."""
    attributes: dict[str, str | int] = {
        "onceflow.tenant": call.tenant,
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
            attributes[f"onceflow.evidence.{name}"] = value
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
        result = await super().execute_activity(input)
        attributes = attempt_attributes(
            call, result if isinstance(result, ToolAttemptResult) else None
        )
        span.set_attributes(attributes)
        logger.info(
            "attempt %s of %s step %s: %s",
            call.attempt,
            call.tool,
            call.step_id,
            attributes.get("onceflow.outcome", "no result"),
            extra={"onceflow": attributes, "activity_type": activity.info().activity_type},
        )
        return result
