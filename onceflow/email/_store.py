"""The outbox tables: what the ``send_email`` activity arms and what relays claim.

Row states (one row per email, ``arming`` counts the workflow's requests to deliver)::

    enqueue ─▶ pending ─ claim ─▶ sending ─ record ─▶ delivered | rejected
                 ▲  │                │                  transient | unknown
                 │  └ withdraw ─▶ transient              │
                 │                   └ claim expired: another relay claims it again
                 │                       (a takeover), then concludes the dead claim:
                 │                         a delivery began sending ─▶ unknown (no send)
                 │                         nothing was sent ─▶ delivers it itself
                 └──── re-arm (next workflow attempt, from transient or unknown only)

Only ``enqueue`` arms a row, so the workflow (whose attempts call it) stays the one
retry owner; a relay makes one delivery per claim and records its outcome under its
``claim_token``, so a relay whose claim was taken over cannot overwrite the newer one.

Each delivery is a row of ``email_deliveries``, inserted before the relay connects; just
before the message goes out (after the server's 354) the relay sets its
``message_sent_at`` in a transaction that renews its claim. So a relay taking over an
expired claim knows from the table alone whether the dead relay may have passed
``DATA``: if so it records ``unknown`` and sends nothing (SMTP has no idempotency and
consumers need not dedupe by ``Message-ID``), and the step parks until an operator
decides; if not, nothing was sent and it delivers the email itself. A stalled relay
whose claim was taken over cannot set the mark any more, so it never sends either.

Each arming also stores the W3C trace context of the attempt that armed it, so the
relay's delivery span joins the task's trace; a claim carries it validated, or None (a
row armed before migration 9, outside a trace, or holding a malformed value).
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from onceflow.email._smtp import DeliveryOutcome, DeliveryReport, OutgoingMessage
from onceflow.telemetry import W3CTraceContext

FINISHED_STATES = frozenset({"delivered", "rejected", "transient", "unknown"})
"""States in which an arming has its outcome."""
_RE_ARMABLE = ("transient", "unknown")

_log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class EmailRequest:
    """The business change that asks for one email (written with its outbox row)."""

    event_id: str
    message_id: str
    tenant: str
    workflow_id: str
    step_id: str
    sender: str
    recipients: tuple[str, ...]
    subject: str
    body: str


@dataclass(frozen=True, kw_only=True)
class OutboxRow:
    """One email's delivery state as the outbox holds it."""

    event_id: str
    message_id: str
    state: str
    arming: int
    armed_by_attempt: int
    claimed_by: str | None
    reason: str | None
    smtp_reply: str | None
    delivered_at: datetime | None
    deliveries: int
    """Delivery attempts relays started for this email, all armings together."""

    @property
    def finished(self) -> bool:
        """Whether the current arming has its outcome."""
        return self.state in FINISHED_STATES


@dataclass(frozen=True, kw_only=True)
class Claim:
    """A relay's claim on one armed row, and the message to deliver."""

    event_id: str
    arming: int
    claim_token: int
    took_over: bool
    """The row was claimed from a relay whose claim had expired."""
    message: OutgoingMessage
    trace_context: W3CTraceContext | None = None
    """The arming attempt's trace, which the delivery continues; None for a row armed
    outside a trace or before migration 9, and for a malformed stored value."""


_READ = """
SELECT o.event_id, m.message_id, o.state, o.arming, o.armed_by_attempt, o.claimed_by,
       o.reason, o.smtp_reply, o.delivered_at,
       (SELECT count(*) FROM email_deliveries d WHERE d.event_id = o.event_id) AS deliveries
FROM email_outbox o JOIN email_messages m USING (event_id)
WHERE o.event_id = %(event_id)s
"""
_INSERT_MESSAGE = """
INSERT INTO email_messages
    (event_id, message_id, tenant, workflow_id, step_id, sender, recipients, subject, body)
VALUES (%(event_id)s, %(message_id)s, %(tenant)s, %(workflow_id)s, %(step_id)s, %(sender)s,
        %(recipients)s, %(subject)s, %(body)s)
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id
"""
_INSERT_OUTBOX = """
INSERT INTO email_outbox (event_id, state, arming, armed_by_attempt, traceparent, tracestate)
VALUES (%(event_id)s, 'pending', 1, %(attempt)s, %(traceparent)s, %(tracestate)s)
"""
_LOCK = "SELECT state, armed_by_attempt FROM email_outbox WHERE event_id = %(event_id)s FOR UPDATE"
_RE_ARM = """
UPDATE email_outbox
SET state = 'pending', arming = arming + 1, armed_by_attempt = %(attempt)s, armed_at = now(),
    claimed_by = NULL, claim_expires_at = NULL, reason = NULL, smtp_reply = NULL,
    traceparent = %(traceparent)s, tracestate = %(tracestate)s, updated_at = now()
WHERE event_id = %(event_id)s
"""
_WITHDRAW = """
UPDATE email_outbox SET state = 'transient', reason = %(reason)s, updated_at = now()
WHERE event_id = %(event_id)s AND arming = %(arming)s AND state = 'pending'
RETURNING event_id
"""
_CLAIM = """
WITH due AS (
    SELECT event_id, state AS was FROM email_outbox
    WHERE state = 'pending' OR (state = 'sending' AND claim_expires_at < now())
    ORDER BY armed_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE email_outbox AS o
SET state = 'sending', claim_token = o.claim_token + 1, claimed_by = %(relay_id)s,
    claim_expires_at = now() + %(lease)s, updated_at = now()
FROM due, email_messages AS m
WHERE o.event_id = due.event_id AND m.event_id = o.event_id
RETURNING o.event_id, o.arming, o.claim_token, due.was = 'sending' AS took_over,
          o.traceparent, o.tracestate,
          m.message_id, m.sender, m.recipients, m.subject, m.body, m.created_at
"""
_RENEW = """
UPDATE email_outbox SET claim_expires_at = now() + %(lease)s, updated_at = now()
WHERE event_id = %(event_id)s AND claim_token = %(claim_token)s AND state = 'sending'
  AND claim_expires_at > now()
RETURNING event_id
"""
_START_DELIVERY = """
INSERT INTO email_deliveries
    (event_id, arming, claim_token, relay_id, took_over, message_sent_at)
VALUES (%(event_id)s, %(arming)s, %(claim_token)s, %(relay_id)s, %(took_over)s, NULL)
RETURNING delivery_id
"""
_MARK_SENT = """
UPDATE email_deliveries SET message_sent_at = now()
WHERE delivery_id = %(delivery_id)s AND outcome IS NULL
RETURNING delivery_id
"""
_LOCK_CLAIM = """
SELECT event_id FROM email_outbox
WHERE event_id = %(event_id)s AND claim_token = %(claim_token)s AND state = 'sending'
FOR UPDATE
"""
_UNFINISHED = """
SELECT delivery_id, relay_id, started_at, message_sent_at FROM email_deliveries
WHERE event_id = %(event_id)s AND arming = %(arming)s AND outcome IS NULL
ORDER BY delivery_id
"""
_RECORD = """
UPDATE email_outbox
SET state = %(outcome)s, reason = %(reason)s, smtp_reply = %(smtp_reply)s,
    delivered_at = CASE WHEN %(outcome)s = 'delivered' THEN now() ELSE delivered_at END,
    claim_expires_at = NULL, updated_at = now()
WHERE event_id = %(event_id)s AND claim_token = %(claim_token)s AND state = 'sending'
RETURNING event_id
"""
_FINISH_DELIVERY = """
UPDATE email_deliveries
SET outcome = %(outcome)s, reason = %(reason)s, smtp_reply = %(smtp_reply)s, finished_at = now()
WHERE delivery_id = %(delivery_id)s
"""
_RELEASE = """
UPDATE email_outbox SET state = 'pending', claimed_by = NULL, claim_expires_at = NULL,
    updated_at = now()
WHERE event_id = %(event_id)s AND claim_token = %(claim_token)s AND state = 'sending'
"""


class EmailOutbox:
    """The outbox over the worker's (or relay's) connection pool."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    # ── the activity's side ─────────────────────────────────────────────────────────

    async def enqueue(
        self,
        request: EmailRequest,
        *,
        attempt: int,
        trace_context: W3CTraceContext | None = None,
    ) -> tuple[OutboxRow, bool]:
        """Write the email and its outbox row in one transaction, or re-arm the row.

        A row whose last arming ended ``transient`` or ``unknown`` is armed again when a
        later workflow attempt asks (``attempt`` greater than the one that armed it), so
        a late duplicate of an old attempt never re-arms. Any other row is left alone.
        An arming stores ``trace_context`` (the attempt's span), which the relay's
        delivery continues.

        Returns:
            The row after the call, and whether this call armed it.
        """
        params: dict[str, Any] = {
            "event_id": request.event_id,
            "message_id": request.message_id,
            "tenant": request.tenant,
            "workflow_id": request.workflow_id,
            "step_id": request.step_id,
            "sender": request.sender,
            "recipients": list(request.recipients),
            "subject": request.subject,
            "body": request.body,
            "attempt": attempt,
            "traceparent": trace_context.traceparent if trace_context else None,
            "tracestate": trace_context.tracestate if trace_context else None,
        }
        async with self._pool.connection() as conn, conn.transaction():
            inserted = await (await conn.execute(_INSERT_MESSAGE, params)).fetchone()
            if inserted is not None:
                await conn.execute(_INSERT_OUTBOX, params)
                armed = True
            else:
                current = await (await conn.execute(_LOCK, params)).fetchone()
                if current is None:
                    raise LookupError("an email without its outbox row")
                armed = current[0] in _RE_ARMABLE and current[1] < attempt
                if armed:
                    await conn.execute(_RE_ARM, params)
            row = await self._read(conn, request.event_id)
        if row is None:
            raise LookupError("the outbox row vanished")
        return row, armed

    async def read(self, event_id: str) -> OutboxRow | None:
        """The row as committed now."""
        async with self._pool.connection() as conn:
            return await self._read(conn, event_id)

    async def withdraw(self, event_id: str, *, arming: int, reason: str) -> bool:
        """Take back an arming no relay has claimed yet; it ends ``transient``."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                _WITHDRAW, {"event_id": event_id, "arming": arming, "reason": reason}
            )
            return await cursor.fetchone() is not None

    # ── the relay's side ────────────────────────────────────────────────────────────

    async def claim(self, *, relay_id: str, lease: timedelta, limit: int) -> list[Claim]:
        """Claim up to ``limit`` armed rows (and rows whose claim expired), skipping rows
        other relays hold locked, so concurrent relays never claim the same row."""
        async with self._pool.connection() as conn, conn.transaction():
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(_CLAIM, {"relay_id": relay_id, "lease": lease, "limit": limit})
            rows = await cursor.fetchall()
        return [
            Claim(
                event_id=row["event_id"],
                arming=row["arming"],
                claim_token=row["claim_token"],
                took_over=row["took_over"],
                message=OutgoingMessage(
                    message_id=row["message_id"],
                    sender=row["sender"],
                    recipients=tuple(row["recipients"]),
                    subject=row["subject"],
                    body=row["body"],
                    date=row["created_at"],
                ),
                trace_context=_stored_trace_context(row),
            )
            for row in rows
        ]

    async def start_delivery(self, claim: Claim, *, relay_id: str, lease: timedelta) -> int | None:
        """Renew the claim and record that a delivery starts; None when the claim is lost."""
        params = {
            "event_id": claim.event_id,
            "arming": claim.arming,
            "claim_token": claim.claim_token,
            "relay_id": relay_id,
            "took_over": claim.took_over,
            "lease": lease,
        }
        async with self._pool.connection() as conn, conn.transaction():
            if await (await conn.execute(_RENEW, params)).fetchone() is None:
                return None
            started = await (await conn.execute(_START_DELIVERY, params)).fetchone()
        return int(started[0]) if started else None

    async def mark_message_sent(self, claim: Claim, delivery_id: int, *, lease: timedelta) -> bool:
        """Record, under a live claim it renews, that the delivery sends its message now.

        Called after the server's 354 and before the message goes out: False (the claim
        expired or was taken over) means the message must not be sent. The claim's row
        stays locked until this commits, so a relay taking the claim over either sees the
        mark or has already taken the claim, and then this returns False.
        """
        params = {
            "event_id": claim.event_id,
            "claim_token": claim.claim_token,
            "delivery_id": delivery_id,
            "lease": lease,
        }
        async with self._pool.connection() as conn, conn.transaction():
            if await (await conn.execute(_RENEW, params)).fetchone() is None:
                return False
            return await (await conn.execute(_MARK_SENT, params)).fetchone() is not None

    async def conclude_takeover(self, claim: Claim, *, relay_id: str) -> DeliveryReport | None:
        """Decide a taken-over claim from what the earlier relays recorded.

        Deliveries of this arming left without an outcome are closed: one that never
        began sending its message (no ``message_sent_at``) ends ``transient``, nothing
        was sent; one that did may have passed ``DATA``, so the email's outcome is
        recorded ``unknown`` under this claim and it is not sent again (the step parks).

        Returns:
            The ``unknown`` report when the email must not be sent; None when it may be
            delivered (nothing was sent yet, or this claim is no longer current).
        """
        params: dict[str, Any] = {
            "event_id": claim.event_id,
            "arming": claim.arming,
            "claim_token": claim.claim_token,
        }
        async with self._pool.connection() as conn, conn.transaction():
            if await (await conn.execute(_LOCK_CLAIM, params)).fetchone() is None:
                return None
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(_UNFINISHED, params)
            unfinished = await cursor.fetchall()
            sent = [row for row in unfinished if row["message_sent_at"] is not None]
            report = None
            if sent:
                last = sent[-1]
                report = DeliveryReport(
                    DeliveryOutcome.UNKNOWN,
                    f"relay {last['relay_id']} held the claim and began sending the message "
                    f"at {last['message_sent_at'].isoformat(timespec='milliseconds')}, then "
                    "its claim expired with no outcome recorded: the message may have passed "
                    f"DATA. Relay {relay_id} took the email over and did not send it again "
                    "(SMTP has no idempotency)",
                )
            for row in unfinished:
                ended = DeliveryReport(
                    DeliveryOutcome.TRANSIENT,
                    f"relay {row['relay_id']}'s claim expired before it sent the message; "
                    f"nothing was sent (relay {relay_id} took the email over)",
                )
                if row["message_sent_at"] is not None and report is not None:
                    ended = report
                await conn.execute(
                    _FINISH_DELIVERY,
                    {**params, **_outcome(ended), "delivery_id": row["delivery_id"]},
                )
            if report is not None:
                await conn.execute(_RECORD, {**params, **_outcome(report)})
        return report

    async def renew(self, claim: Claim, *, lease: timedelta) -> bool:
        """Extend a live claim; False when it expired or was taken over."""
        params = {"event_id": claim.event_id, "claim_token": claim.claim_token, "lease": lease}
        async with self._pool.connection() as conn:
            return await (await conn.execute(_RENEW, params)).fetchone() is not None

    async def record(self, claim: Claim, delivery_id: int, report: DeliveryReport) -> bool:
        """Record a delivery's outcome; the row takes it only while the claim is current."""
        params = {
            "event_id": claim.event_id,
            "claim_token": claim.claim_token,
            "delivery_id": delivery_id,
            **_outcome(report),
        }
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(_FINISH_DELIVERY, params)
            return await (await conn.execute(_RECORD, params)).fetchone() is not None

    async def release(self, claim: Claim) -> None:
        """Give back a claim whose delivery never started (a relay stopping)."""
        async with self._pool.connection() as conn:
            await conn.execute(
                _RELEASE, {"event_id": claim.event_id, "claim_token": claim.claim_token}
            )

    @staticmethod
    async def _read(conn: Any, event_id: str) -> OutboxRow | None:
        cursor = conn.cursor(row_factory=dict_row)
        await cursor.execute(_READ, {"event_id": event_id})
        row = await cursor.fetchone()
        return OutboxRow(**row) if row else None


def _stored_trace_context(row: dict[str, Any]) -> W3CTraceContext | None:
    """The row's trace context, validated; a malformed one is ignored (the email still
    goes out, in a trace of its own) and named by event id only."""
    if row["traceparent"] is None:
        return None
    stored = W3CTraceContext.parse(row["traceparent"], row["tracestate"])
    if stored is None:
        _log.warning(
            "email %s: ignored a malformed traceparent; it is delivered in a trace of its own",
            row["event_id"],
        )
    return stored


def _outcome(report: DeliveryReport) -> dict[str, Any]:
    return {
        "outcome": report.outcome.value,
        "reason": report.reason,
        "smtp_reply": report.smtp_reply,
    }
