"""The payment tools' settings: how a worker reaches Stripe (``[stripe]``) and what the
workflow needs to know about the provider (``[tools.payments]``), both read at start-up."""

from datetime import timedelta

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from onceflow.settings import FileBackedSettings


class StripeSettings(FileBackedSettings):
    """How a worker reaches Stripe (or a Stripe-compatible provider).

    Durations read from the environment are ISO 8601 (``PT20S``) or ``HH:MM:SS``.
    ``account`` is part of every derived child key, so it must be the same on every
    worker and must not change while tasks are running. File table: ``[stripe]``.
    """

    config_table = "stripe"
    model_config = SettingsConfigDict(
        env_prefix="ONCEFLOW_STRIPE_", extra="ignore", frozen=True, populate_by_name=True
    )

    api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("STRIPE_API_KEY", "api_key")
    )
    """Secret key (``STRIPE_API_KEY``). Default: none, and payment tools reject every call."""
    api_base: str | None = Field(
        default=None, validation_alias=AliasChoices("STRIPE_API_BASE", "api_base")
    )
    """API base address (``STRIPE_API_BASE``), only to point elsewhere than Stripe.
    Default: none, meaning ``https://api.stripe.com``."""
    account: str = Field(default="default", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
    """The Stripe account idempotency keys are scoped to (``ONCEFLOW_STRIPE_ACCOUNT``,
    e.g. ``acct_…``); identical on every worker. Default ``default``."""
    connect_timeout: timedelta = Field(default=timedelta(seconds=5), gt=timedelta(0))
    """Longest wait to establish a connection (``ONCEFLOW_STRIPE_CONNECT_TIMEOUT``).
    Default 5 s."""
    request_timeout: timedelta = Field(default=timedelta(seconds=20), gt=timedelta(0))
    """Longest wait to send the request and to receive the answer
    (``ONCEFLOW_STRIPE_REQUEST_TIMEOUT``). Default 20 s."""

    @field_validator("api_base")
    @classmethod
    def _no_trailing_slash(cls, value: str | None) -> str | None:
        return value.rstrip("/") if value else None

    @property
    def configured(self) -> bool:
        """Whether an API key is set, so payment tools can run."""
        return self.api_key is not None and bool(self.api_key.get_secret_value())

    @property
    def longest_call(self) -> timedelta:
        """The longest one Stripe call can take: connect, then send and receive.

        Sending a small form body is near-instant, so the answer's wait dominates.
        """
        return self.connect_timeout + self.request_timeout


class PaymentToolSettings(FileBackedSettings):
    """What the workflow needs to know about the payment provider; same on every worker.

    Read from ``ONCEFLOW_PAYMENTS_*`` and the file's ``[tools.payments]``; durations are
    ISO 8601 (``PT24H``) or ``HH:MM:SS``. A task pins the values of the worker that runs
    its first workflow task (``ToolPolicy``, recorded in its history) and decides by them
    to its end, so a worker restarted with other values changes new tasks only.
    """

    config_table = "tools.payments"
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_PAYMENTS_", extra="ignore", frozen=True)

    key_retention: timedelta = Field(default=timedelta(hours=24), gt=timedelta(0))
    """How long the provider honours an idempotency key (Stripe: about 24 h). Default 24 h."""
    retention_margin: timedelta = Field(default=timedelta(hours=1), ge=timedelta(0))
    """Subtracted from ``key_retention`` before a repeat is still called safe, for clock
    skew and the time a request spends in flight. Default 1 h."""
    settle_time: timedelta = Field(default=timedelta(minutes=5), ge=timedelta(0))
    """Longest a request may still take effect at Stripe after the attempt that sent it
    ended: an operator-authorised attempt under a new key waits this long after the old
    key's last attempt and looks again first. Default 5 min."""
    refund_approval_above: int = Field(default=10_000, ge=0)
    """Refunds of more than this many minor units (or of an unstated amount) wait for a
    person's approval. Default 10 000 (100.00 in a two-decimal currency)."""
    attempt_timeout: timedelta = Field(default=timedelta(seconds=60), gt=timedelta(0))
    """Longest one attempt (or lookup) may run before its outcome counts as unknown; must
    exceed two Stripe calls (``ONCEFLOW_STRIPE_*_TIMEOUT``). Default 60 s."""

    @model_validator(mode="after")
    def _margin_leaves_a_window(self) -> "PaymentToolSettings":
        if self.retention_margin >= self.key_retention:
            raise ValueError("retention_margin must be shorter than key_retention")
        return self
