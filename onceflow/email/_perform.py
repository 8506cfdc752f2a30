"""Performs ``send_email``: arms the email's outbox row and waits for a relay's outcome.

One attempt::

    event id = the step's child key for "email" at the outbox (its operation record's key)
      │
      ├─ recorded 'succeeded' already? ──▶ report that delivery; nothing is armed
      ├─ enqueue: the email and its outbox row in one transaction (first attempt), or
      │  re-arm the row if its last arming ended transient/unknown (a later attempt:
      │  the workflow's retry, or an operator's "did not happen"); anything else is
      │  left alone, so a delivered email is reported, never sent again
      ├─ wait, heartbeating, for the current arming's outcome, recorded by a relay
      │    delivered ─▶ succeeded (recorded)    rejected ─▶ rejected (recorded)
      │    transient ─▶ transient    unknown ─▶ unknown: the step parks
      │      (the reply after DATA was lost, or the relay died after it began sending and
      │      the relay that took its claim over sent nothing)
      └─ out of time: withdraw an arming no relay claimed (transient), else unknown

A perform never talks SMTP and never retries; relays deliver, the workflow decides.
"""

import asyncio
import logging
from typing import Any

from onceflow.email._contract import SendEmailInput
from onceflow.email._settings import EmailSettings
from onceflow.email._store import EmailOutbox, EmailRequest, OutboxRow
from onceflow.telemetry import W3CTraceContext
from onceflow.tools import (
    ChildOperation,
    OutcomeClass,
    ToolAttemptResult,
    ToolCall,
    classify_database_error,
)

EMAIL_CHILD_OP = "email"
"""Child operation name of an email in its derived key (the event id)."""
OUTBOX_ACCOUNT = "onceflow-outbox"
"""The 'provider account' of event ids: the outbox lives in onceflow's own database."""

_log = logging.getLogger(__name__)

_OUTCOMES = {
    "delivered": OutcomeClass.SUCCEEDED,
    "rejected": OutcomeClass.REJECTED,
    "transient": OutcomeClass.TRANSIENT,
    "unknown": OutcomeClass.UNKNOWN,
}
_MARGIN = 0.1
"""Share of the attempt's timeout kept back to report before Temporal gives up on it."""


class OutboxSending:
    """``send_email``'s perform and look-up, bound to the sender's settings.

    Args:
        settings: Sender, ``Message-ID`` domain and how often to look at the outbox.
    """

    def __init__(self, settings: EmailSettings) -> None:
        self._settings = settings

    async def send_email(self, call: ToolCall[SendEmailInput]) -> ToolAttemptResult:
        """Have the step's email delivered once and report how its delivery ended.

        The documented result: ``message_id``, ``event_id``, ``delivered_at``, ``relay``,
        ``smtp_reply``, ``arming`` (how many times the workflow asked for delivery) and
        ``replayed`` (true when an earlier attempt's delivery is reported).
        """
        operation = await call.begin(EMAIL_CHILD_OP, provider_account=OUTBOX_ACCOUNT)
        if operation.earlier_success:
            success = operation.earlier_success
            return success.model_copy(update={"result": {**success.result, "replayed": True}})
        arguments = call.args
        event_id = operation.key
        request = EmailRequest(
            event_id=event_id,
            message_id=f"<{event_id}@{self._settings.message_id_domain}>",
            tenant=call.tenant,
            workflow_id=call.workflow_id,
            step_id=call.step_id,
            sender=self._settings.sender,
            recipients=tuple(arguments.to),
            subject=arguments.subject,
            body=arguments.body,
        )
        outbox = EmailOutbox(call.pool)
        try:
            # The attempt's span (RunActivity): the relay's delivery continues its trace.
            row, armed = await outbox.enqueue(
                request, attempt=call.attempt, trace_context=W3CTraceContext.current()
            )
        except Exception as error:  # every failure is classified, none escapes unlabelled
            outcome, reason = classify_database_error(error)
            evidence = {"event_id": event_id, "message_id": request.message_id}
            return await operation.failed(outcome, reason, evidence=evidence)
        if not armed and row.finished:
            return await _report(operation, row, replayed=True)
        return await self._await_outcome(call, operation, outbox, row, replayed=not armed)

    async def look_up_send_email(self, call: ToolCall[SendEmailInput]) -> ToolAttemptResult:
        """Before the step parks: a row a relay recorded as delivered proves the effect."""
        operation = await call.find(EMAIL_CHILD_OP, provider_account=OUTBOX_ACCOUNT)
        try:
            row = await EmailOutbox(call.pool).read(operation.key)
        except Exception as error:
            _, reason = classify_database_error(error)
            return ToolAttemptResult(outcome=OutcomeClass.UNKNOWN, reason=reason)
        if row is None:
            # Read in the same database the step's send writes first: nothing was queued.
            return ToolAttemptResult(
                outcome=OutcomeClass.UNKNOWN,
                reason="no outbox row for this step",
                miss_proves_absence=True,
            )
        if row.state == "delivered":
            return await _report(operation, row, replayed=True, found_by="lookup:outbox")
        return ToolAttemptResult(
            outcome=OutcomeClass.UNKNOWN,
            reason=f"the outbox row is {row.state}: {row.reason or 'no outcome recorded yet'}",
            evidence={**operation.evidence, **_evidence(row)},
        )

    async def _await_outcome(
        self,
        call: ToolCall[SendEmailInput],
        operation: ChildOperation,
        outbox: EmailOutbox,
        row: OutboxRow,
        *,
        replayed: bool,
    ) -> ToolAttemptResult:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + call.attempt_timeout.total_seconds() * (1 - _MARGIN)
        arming = row.arming
        poll = self._settings.poll_interval.total_seconds()
        while True:
            call.heartbeat({"event_id": row.event_id, "arming": arming, "state": row.state})
            if row.arming != arming:
                # Only a later attempt re-arms; this one is stale and says so.
                return ToolAttemptResult(
                    outcome=OutcomeClass.UNKNOWN,
                    reason=f"a later attempt re-armed the email (arming {row.arming})",
                    evidence={**operation.evidence, **_evidence(row)},
                )
            if row.finished:
                return await _report(operation, row, replayed=replayed)
            if loop.time() >= deadline:
                return await _give_up(operation, outbox, row)
            await asyncio.sleep(poll)
            try:
                row = await outbox.read(row.event_id) or row
            except Exception as error:  # reading is harmless to repeat until the deadline
                _log.warning("reading the outbox failed: %s", classify_database_error(error)[1])


async def _give_up(
    operation: ChildOperation, outbox: EmailOutbox, row: OutboxRow
) -> ToolAttemptResult:
    reason = "no relay claimed the email in time; it was withdrawn, nothing was sent"
    try:
        withdrawn = await outbox.withdraw(row.event_id, arming=row.arming, reason=reason)
        row = await outbox.read(row.event_id) or row
    except Exception as error:
        _, why = classify_database_error(error)
        return ToolAttemptResult(
            outcome=OutcomeClass.UNKNOWN,
            reason=f"out of time and {why}",
            evidence={**operation.evidence, **_evidence(row)},
        )
    if withdrawn:
        return await operation.failed(OutcomeClass.TRANSIENT, reason, evidence=_evidence(row))
    if row.finished:
        return await _report(operation, row, replayed=False)
    return await operation.failed(
        OutcomeClass.UNKNOWN,
        f"out of time while relay {row.claimed_by} was still delivering the email",
        evidence=_evidence(row),
    )


async def _report(
    operation: ChildOperation, row: OutboxRow, *, replayed: bool, found_by: str | None = None
) -> ToolAttemptResult:
    """The arming's outcome as this attempt's; a delivery or a refusal is recorded."""
    outcome = _OUTCOMES[row.state]
    if outcome is not OutcomeClass.SUCCEEDED:
        reason = row.reason or f"the outbox row is {row.state}"
        return await operation.failed(outcome, reason, evidence=_evidence(row))
    result: dict[str, Any] = {
        "message_id": row.message_id,
        "event_id": row.event_id,
        "delivered_at": row.delivered_at.isoformat() if row.delivered_at else None,
        "relay": row.claimed_by,
        "smtp_reply": row.smtp_reply,
        "arming": row.arming,
        "replayed": replayed,
    }
    if found_by is not None:
        result["found_by"] = found_by
    return await operation.succeeded(
        row.message_id, result, evidence=_evidence(row), message_id=row.message_id
    )


def _evidence(row: OutboxRow) -> dict[str, str]:
    evidence = {
        "event_id": row.event_id,
        "message_id": row.message_id,
        "outbox_state": row.state,
        "arming": str(row.arming),
        "deliveries_started": str(row.deliveries),
    }
    if row.claimed_by:
        evidence["relay"] = row.claimed_by
    if row.smtp_reply:
        evidence["smtp_reply"] = row.smtp_reply
    return evidence
