"""Performs ``send_email``: arms the email's outbox row and waits for a relay's outcome.

One attempt::

    event id = derive_child_key(tenant, workflow, step, "email", "onceflow-outbox")
      │
      ├─ enqueue: the email and its outbox row in one transaction (first attempt), or
      │  re-arm the row if its last arming ended transient/unknown (a later attempt:
      │  the workflow's retry, or an operator's "did not happen"); anything else is
      │  left alone, so a delivered email is reported, never sent again
      ├─ wait, heartbeating, for the current arming's outcome, recorded by a relay
      │    delivered ─▶ succeeded    rejected ─▶ rejected
      │    transient ─▶ transient    unknown (sent, reply lost) ─▶ unknown: the step parks
      └─ out of time: withdraw an arming no relay claimed (transient), else unknown

The activity never talks SMTP and never retries; relays deliver, the workflow decides.
"""

import asyncio
from typing import Any

from psycopg_pool import AsyncConnectionPool
from temporalio import activity

from onceflow.email import EmailOutbox, EmailRequest, EmailSettings, OutboxRow
from onceflow.retry_policy import OutcomeClass
from onceflow.storage import classify_database_error
from onceflow.tools import ToolAttemptResult, ToolCallInput, derive_child_key
from onceflow.tools.email import (
    EMAIL_CHILD_OP,
    LOOK_UP_EMAIL,
    OUTBOX_ACCOUNT,
    SEND_EMAIL,
    SendEmailInput,
)

_OUTCOMES = {
    "delivered": OutcomeClass.SUCCEEDED,
    "rejected": OutcomeClass.REJECTED,
    "transient": OutcomeClass.TRANSIENT,
    "unknown": OutcomeClass.UNKNOWN,
}
_MARGIN = 0.1
"""Share of the attempt's timeout kept back to report before Temporal gives up on it."""


def email_event_id(call: ToolCallInput) -> str:
    """The step's event id: stable across attempts, runs and workers."""
    return derive_child_key(
        tenant=call.tenant,
        workflow_id=call.workflow_id,
        step_id=call.step_id,
        child_op=EMAIL_CHILD_OP,
        provider_account=OUTBOX_ACCOUNT,
    )


class EmailActivities:
    """The email tool's activities, bound to the worker's pool and email settings."""

    def __init__(self, pool: AsyncConnectionPool, settings: EmailSettings) -> None:
        self._outbox = EmailOutbox(pool)
        self._settings = settings

    @activity.defn(name=SEND_EMAIL.name)
    async def send_email(self, call: ToolCallInput) -> ToolAttemptResult:
        """Have the step's email delivered once and report how its delivery ended.

        The documented result: ``message_id``, ``event_id``, ``delivered_at``, ``relay``,
        ``smtp_reply``, ``arming`` (how many times the workflow asked for delivery) and
        ``replayed`` (true when an earlier attempt's delivery is reported).
        """
        arguments = SendEmailInput.model_validate(call.arguments)
        event_id = email_event_id(call)
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
        evidence = {"event_id": event_id, "message_id": request.message_id}
        try:
            row, armed = await self._outbox.enqueue(request, attempt=call.attempt)
        except Exception as error:  # every failure is classified, none escapes unlabelled
            outcome, reason = classify_database_error(error)
            return ToolAttemptResult(outcome=outcome, reason=reason, evidence=evidence)
        if not armed and row.finished:
            return _report(row, replayed=True)
        return await self._await_outcome(row, replayed=not armed)

    @activity.defn(name=LOOK_UP_EMAIL)
    async def look_up_send_email(self, call: ToolCallInput) -> ToolAttemptResult:
        """Before the step parks: a row a relay recorded as delivered proves the effect."""
        event_id = email_event_id(call)
        try:
            row = await self._outbox.read(event_id)
        except Exception as error:
            _, reason = classify_database_error(error)
            return ToolAttemptResult(outcome=OutcomeClass.UNKNOWN, reason=reason)
        if row is None:
            return ToolAttemptResult(
                outcome=OutcomeClass.UNKNOWN, reason="no outbox row for this step"
            )
        if row.state == "delivered":
            found = _report(row, replayed=True)
            found.result["found_by"] = "lookup:outbox"
            return found
        return ToolAttemptResult(
            outcome=OutcomeClass.UNKNOWN,
            reason=f"the outbox row is {row.state}: {row.reason or 'no outcome recorded yet'}",
            evidence=_evidence(row),
        )

    async def _await_outcome(self, row: OutboxRow, *, replayed: bool) -> ToolAttemptResult:
        loop = asyncio.get_running_loop()
        timeout = activity.info().start_to_close_timeout or SEND_EMAIL.attempt_timeout
        deadline = loop.time() + timeout.total_seconds() * (1 - _MARGIN)
        arming = row.arming
        poll = self._settings.poll_interval.total_seconds()
        while True:
            activity.heartbeat({"event_id": row.event_id, "arming": arming, "state": row.state})
            if row.arming != arming:
                # Only a later attempt re-arms; this one is stale and says so.
                return ToolAttemptResult(
                    outcome=OutcomeClass.UNKNOWN,
                    reason=f"a later attempt re-armed the email (arming {row.arming})",
                    evidence=_evidence(row),
                )
            if row.finished:
                return _report(row, replayed=replayed)
            if loop.time() >= deadline:
                return await self._give_up(row)
            await asyncio.sleep(poll)
            try:
                row = await self._outbox.read(row.event_id) or row
            except Exception as error:  # reading is harmless to repeat until the deadline
                activity.logger.warning("reading the outbox failed: %s", error)

    async def _give_up(self, row: OutboxRow) -> ToolAttemptResult:
        reason = "no relay claimed the email in time; it was withdrawn, nothing was sent"
        try:
            withdrawn = await self._outbox.withdraw(row.event_id, arming=row.arming, reason=reason)
            row = await self._outbox.read(row.event_id) or row
        except Exception as error:
            _, why = classify_database_error(error)
            return ToolAttemptResult(
                outcome=OutcomeClass.UNKNOWN,
                reason=f"out of time and {why}",
                evidence=_evidence(row),
            )
        if withdrawn:
            return ToolAttemptResult(
                outcome=OutcomeClass.TRANSIENT, reason=reason, evidence=_evidence(row)
            )
        if row.finished:
            return _report(row, replayed=False)
        return ToolAttemptResult(
            outcome=OutcomeClass.UNKNOWN,
            reason=f"out of time while relay {row.claimed_by} was still delivering the email",
            evidence=_evidence(row),
        )


def _report(row: OutboxRow, *, replayed: bool) -> ToolAttemptResult:
    outcome = _OUTCOMES[row.state]
    if outcome is not OutcomeClass.SUCCEEDED:
        return ToolAttemptResult(outcome=outcome, reason=row.reason, evidence=_evidence(row))
    result: dict[str, Any] = {
        "message_id": row.message_id,
        "event_id": row.event_id,
        "delivered_at": row.delivered_at.isoformat() if row.delivered_at else None,
        "relay": row.claimed_by,
        "smtp_reply": row.smtp_reply,
        "arming": row.arming,
        "replayed": replayed,
    }
    return ToolAttemptResult(
        outcome=outcome, resource_id=row.message_id, result=result, evidence=_evidence(row)
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
