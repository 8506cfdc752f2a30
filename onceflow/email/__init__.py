"""The ``send_email`` tool and its outbox: the email and its outbox row commit in one
transaction in PostgreSQL, relays deliver it over SMTP.

Built on the public tool API like any user's tool: ``email_tools(tool_settings, email)``
returns it. Its perform writes the email and its outbox row and waits for the outcome of
that arming; relays (``OutboxRelay``, ``onceflow relay``) claim rows with
``FOR UPDATE SKIP LOCKED`` and deliver each with its event id as ``Message-ID``::

    send_email ── enqueue (arm) ──▶ email_outbox ◀── claim / record ── relay ── SMTP ──▶ server
        ▲                              │
        └──── wait for the outcome ────┘   delivered | rejected | transient | unknown

A relay that dies holding a claim leaves it to expire; the relay taking it over sends
nothing if the dead one had begun sending the message (``unknown``: the step parks),
and delivers it otherwise.

Nothing here imports the dev stack; point ``SMTP_URL`` at any SMTP server.
"""

from onceflow.email._contract import SendEmailInput, send_email_contract
from onceflow.email._perform import EMAIL_CHILD_OP, OUTBOX_ACCOUNT, OutboxSending
from onceflow.email._relay import OutboxRelay, serve_relay
from onceflow.email._settings import EmailSettings, EmailToolSettings, SmtpServer
from onceflow.email._smtp import DeliveryOutcome, DeliveryReport, OutgoingMessage, deliver
from onceflow.email._store import FINISHED_STATES, Claim, EmailOutbox, EmailRequest, OutboxRow
from onceflow.settings import SettingsSource
from onceflow.tools import Tool, ToolFamily

__all__ = [
    "EMAIL_CHILD_OP",
    "FINISHED_STATES",
    "OUTBOX_ACCOUNT",
    "Claim",
    "DeliveryOutcome",
    "DeliveryReport",
    "EmailOutbox",
    "EmailRequest",
    "EmailSettings",
    "EmailToolSettings",
    "OutboxRelay",
    "OutboxRow",
    "OutgoingMessage",
    "SendEmailInput",
    "SmtpServer",
    "deliver",
    "email_family",
    "email_tools",
    "send_email_contract",
    "serve_relay",
]


def email_tools(tool_settings: EmailToolSettings, email: EmailSettings) -> tuple[Tool, ...]:
    """The email family's tools: ``send_email``, with its outbox look-up.

    It has no client: it talks to the outbox in onceflow's database (``ToolCall.pool``);
    relays, not the worker, talk SMTP.

    Args:
        tool_settings: What the workflow decides from (``[tools.email]``); the same on
            every worker.
        email: Sender, ``Message-ID`` domain and outbox polling (``[email]``).
    """
    sending = OutboxSending(email)
    return (
        Tool(
            contract=send_email_contract(tool_settings),
            perform=sending.send_email,
            look_up=sending.look_up_send_email,
        ),
    )


def email_family(settings: SettingsSource) -> ToolFamily:
    """The email family as every process loads it: ``send_email`` under ``[tools.email]``
    and ``[email]``. A worker needs no service for it: relays deliver, and they need
    ``SMTP_URL`` (``onceflow relay`` refuses to start without it)."""
    return ToolFamily(
        name="email",
        tools=email_tools(settings.read(EmailToolSettings), settings.read(EmailSettings)),
    )
