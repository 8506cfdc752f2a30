"""The ``send_email`` tool: an outbox row commits with the request; relays deliver it.

SMTP has no idempotency key, so the strategy is the outbox: the email and its outbox
row (with an event id derived from the step's child key) commit in one transaction, a
relay delivers it with the event id as ``Message-ID`` and the consumer dedupes on it.
Repeating the *step* re-arms the same row, never a second one. But an attempt whose
message was sent and whose reply was lost is ``unknown``: nothing proves a resend is
harmless at an arbitrary SMTP server, so the step parks for a person
(``safe_repeat_window`` of an outbox is zero).

Configuration (``EmailToolSettings``) is read from the environment and the configuration
file's ``[tools.email]`` once, at import; the workflow reads these contracts, so every
worker must run with the same values.
"""

from datetime import timedelta
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic_settings import SettingsConfigDict

from onceflow.settings import FileBackedSettings, read_settings
from onceflow.tools._contract import DedupeStrategy, EffectFlags, ToolContract

EMAIL_CHILD_OP = "email"
"""Child operation name of an email in its derived key (the event id)."""
OUTBOX_ACCOUNT = "onceflow-outbox"
"""The 'provider account' of event ids: the outbox lives in onceflow's own database."""
LOOK_UP_EMAIL = "look_up_send_email"
"""Activity that reads the outbox row before a step parks: a delivered row is proof."""

EmailAddress = Annotated[
    str,
    # ASCII only: SMTP without the SMTPUTF8 extension cannot carry other addresses.
    StringConstraints(max_length=254, pattern=r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9.-]+$"),
]


class EmailToolSettings(FileBackedSettings):
    """What the workflow needs to know about ``send_email``; same on every worker.

    Read from ``ONCEFLOW_EMAIL_*`` and the file's ``[tools.email]``; durations are
    ISO 8601 (``PT2M``) or ``HH:MM:SS``.
    """

    config_table = "tools.email"
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_EMAIL_", extra="ignore", frozen=True)

    attempt_timeout: timedelta = Field(default=timedelta(minutes=2), gt=timedelta(seconds=2))
    """Longest one attempt waits for a relay's outcome. An arming no relay has claimed by
    then is withdrawn (transient); one still being delivered is unknown. Default 2 min."""
    heartbeat_timeout: timedelta = Field(default=timedelta(seconds=30), gt=timedelta(0))
    """Longest silence from a waiting attempt before Temporal gives up on it (its
    worker died); the step then looks the row up and parks unless it was delivered.
    Default 30 s."""

    @model_validator(mode="after")
    def _heartbeats_fit_in_an_attempt(self) -> "EmailToolSettings":
        if self.heartbeat_timeout >= self.attempt_timeout:
            raise ValueError("heartbeat_timeout must be shorter than attempt_timeout")
        return self


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
        # Not idempotent: a new call (another task) sends another email, and a relay
        # that takes over a dead relay's delivery resends the same Message-ID, which
        # only a consumer that dedupes on it ignores. Not destructive: it adds a
        # message, it replaces nothing. Open world: it reaches any SMTP server.
        effects=EffectFlags(read_only=False, destructive=False, idempotent=False, open_world=True),
        dedupe=DedupeStrategy.OUTBOX,
        start_to_close_timeout=settings.attempt_timeout,
        heartbeat_timeout=settings.heartbeat_timeout,
        lookup_activity=LOOK_UP_EMAIL,
    )


EMAIL_TOOL_SETTINGS = read_settings(EmailToolSettings)
"""The settings every worker read at import; the contract below is built from them."""
SEND_EMAIL = send_email_contract(EMAIL_TOOL_SETTINGS)
