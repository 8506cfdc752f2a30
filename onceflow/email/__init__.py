"""onceflow's email integration: an outbox in PostgreSQL, relays that deliver over SMTP.

The ``send_email`` activity writes the email and its outbox row in one transaction and
waits for the outcome of that arming; relays (``OutboxRelay``, ``onceflow relay``) claim
rows with ``FOR UPDATE SKIP LOCKED`` and deliver each with its event id as
``Message-ID``::

    activity ── enqueue (arm) ──▶ email_outbox ◀── claim / record ── relay ── SMTP ──▶ server
        ▲                              │
        └──── wait for the outcome ────┘   delivered | rejected | transient | unknown

Nothing here imports the dev stack; point ``SMTP_URL`` at any SMTP server.
"""

from onceflow.email._relay import OutboxRelay, serve_relay
from onceflow.email._settings import EmailSettings, SmtpServer
from onceflow.email._smtp import DeliveryOutcome, DeliveryReport, OutgoingMessage, deliver
from onceflow.email._store import FINISHED_STATES, Claim, EmailOutbox, EmailRequest, OutboxRow

__all__ = [
    "FINISHED_STATES",
    "Claim",
    "DeliveryOutcome",
    "DeliveryReport",
    "EmailOutbox",
    "EmailRequest",
    "EmailSettings",
    "OutboxRelay",
    "OutboxRow",
    "OutgoingMessage",
    "SmtpServer",
    "deliver",
    "serve_relay",
]
