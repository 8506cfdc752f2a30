"""The email settings: where relays deliver and how they claim rows (``[email]``), and what
the workflow needs to know about ``send_email`` (``[tools.email]``)."""

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from onceflow.settings import FileBackedSettings

_SCHEMES = ("smtp", "smtps")


def default_relay_id() -> str:
    """``relay-<host>-<pid>``: unique per process, readable in the outbox's claim column."""
    return f"relay-{socket.gethostname()}-{os.getpid()}"


class EmailSettings(FileBackedSettings):
    """How the ``send_email`` activity writes messages and how relays deliver them.

    Read from ``SMTP_URL`` and ``ONCEFLOW_EMAIL_*``; durations are ISO 8601 (``PT20S``)
    or ``HH:MM:SS``. File table: ``[email]``.
    """

    config_table = "email"
    model_config = SettingsConfigDict(
        env_prefix="ONCEFLOW_EMAIL_", extra="ignore", frozen=True, populate_by_name=True
    )

    smtp_url: str | None = Field(
        default=None, validation_alias=AliasChoices("SMTP_URL", "smtp_url")
    )
    """Where relays deliver (``SMTP_URL``): ``smtp://[user:password@]host:port`` or
    ``smtps://…`` for implicit TLS. Default: none; a relay refuses to start without it."""
    sender: str = Field(default="onceflow@localhost", pattern=r"^[^@\s<>]+@[^@\s<>]+$")
    """Envelope sender and ``From`` of every message (``ONCEFLOW_EMAIL_SENDER``).
    Default ``onceflow@localhost``."""
    message_id_domain: str = Field(default="onceflow.local", pattern=r"^[A-Za-z0-9.-]{1,253}$")
    """Right-hand side of every ``Message-ID`` (``<event id@domain>``). Default
    ``onceflow.local``."""
    smtp_timeout: timedelta = Field(default=timedelta(seconds=20), gt=timedelta(0))
    """Longest wait for any one SMTP reply, the one after ``DATA`` included; a timeout
    after the message was sent is an unknown outcome. Default 20 s."""
    claim_lease: timedelta = Field(default=timedelta(seconds=60), ge=timedelta(seconds=1))
    """How long a relay's claim on a row lasts unless renewed; a live relay renews it
    every third of this while it delivers, so only a dead or stalled relay's claim
    expires and another relay takes the row over. Default 60 s."""
    poll_interval: timedelta = Field(default=timedelta(milliseconds=500), gt=timedelta(0))
    """How often an idle relay and a waiting ``send_email`` attempt look at the outbox.
    Default 0.5 s."""
    batch_size: int = Field(default=10, ge=1, le=1000)
    """Rows one relay claims at a time. Default 10."""
    relay_id: str = Field(default_factory=default_relay_id, min_length=1, max_length=200)
    """This relay's name in claims and delivery records. Default ``relay-<host>-<pid>``."""

    @field_validator("smtp_url")
    @classmethod
    def _is_an_smtp_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        parts = urlsplit(value)
        if parts.scheme not in _SCHEMES or not parts.hostname:
            raise ValueError("SMTP_URL must look like smtp://host:port or smtps://host:port")
        return value

    @property
    def smtp_server(self) -> "SmtpServer":
        """The parsed ``SMTP_URL``; raises ``ValueError`` when it is not set."""
        if self.smtp_url is None:
            raise ValueError("SMTP_URL is not set")
        parts = urlsplit(self.smtp_url)
        return SmtpServer(
            host=parts.hostname or "",
            port=parts.port or (465 if parts.scheme == "smtps" else 25),
            implicit_tls=parts.scheme == "smtps",
            username=parts.username,
            password=SecretStr(parts.password) if parts.password else None,
        )


class EmailToolSettings(FileBackedSettings):
    """What the workflow needs to know about ``send_email``; same on every worker.

    Read from ``ONCEFLOW_EMAIL_*`` and the file's ``[tools.email]``; durations are
    ISO 8601 (``PT2M``) or ``HH:MM:SS``. The workflow reads the contract built from these
    values, so every worker must run with the same values.
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


@dataclass(frozen=True, kw_only=True)
class SmtpServer:
    """One SMTP server, parsed from ``SMTP_URL``."""

    host: str
    port: int
    implicit_tls: bool = False
    username: str | None = None
    password: SecretStr | None = None

    def describe(self) -> str:
        """``smtp://host:port`` without credentials, safe to print."""
        return f"{'smtps' if self.implicit_tls else 'smtp'}://{self.host}:{self.port}"
