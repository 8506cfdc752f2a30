"""The Stripe connection settings of one worker process (``[stripe]``), read once at start-up."""

from datetime import timedelta

from pydantic import AliasChoices, Field, SecretStr, field_validator
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
