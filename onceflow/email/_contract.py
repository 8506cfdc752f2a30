"""What ``send_email`` does to the world: an outbox row commits with the request; relays
deliver it.

SMTP has no idempotency key, so the strategy is the outbox: the email and its outbox
row (with an event id derived from the step's child key) commit in one transaction and a
relay delivers it with the event id as ``Message-ID``. Repeating the *step* re-arms the
same row, never a second one. But an attempt whose message was sent and whose reply was
lost is ``unknown``, and so is one whose relay died after it began sending the message
(the relay taking the claim over sends nothing): nothing proves a resend is harmless at
an arbitrary SMTP server, which need not dedupe by ``Message-ID``, so the step parks for
a person (``safe_repeat_window`` of an outbox is zero).
"""

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from onceflow.email._settings import EmailToolSettings
from onceflow.tools import DedupeStrategy, EffectFlags, ToolContract

EmailAddress = Annotated[
    str,
    # ASCII only: SMTP without the SMTPUTF8 extension cannot carry other addresses.
    StringConstraints(max_length=254, pattern=r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9.-]+$"),
]


class SendEmailInput(BaseModel):
    """Send one plain-text email."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    to: Annotated[list[EmailAddress], Field(min_length=1, max_length=50)]
    """Recipients."""
    subject: str = Field(min_length=1, max_length=200, pattern=r"^[^\r\n]+$")
    """One line."""
    body: str = Field(min_length=1, max_length=100_000)
    """Plain text."""


def send_email_contract(settings: EmailToolSettings, *, name: str = "send_email") -> ToolContract:
    """The ``send_email`` contract under ``settings`` (``name`` for test variants)."""
    return ToolContract(
        name=name,
        description=(
            "Send a plain-text email through onceflow's outbox; the same call in the same "
            "task sends at most one message unless an operator authorises another."
        ),
        input_model=SendEmailInput,
        # Not idempotent: a new call (another task) sends another email, and an
        # operator's "did not happen" resends the same Message-ID, which only a
        # consumer that dedupes on it ignores. Not destructive: it adds a message, it
        # replaces nothing. Open world: it reaches any SMTP server.
        effects=EffectFlags(read_only=False, destructive=False, idempotent=False, open_world=True),
        dedupe=DedupeStrategy.OUTBOX,
        start_to_close_timeout=settings.attempt_timeout,
        heartbeat_timeout=settings.heartbeat_timeout,
    )
