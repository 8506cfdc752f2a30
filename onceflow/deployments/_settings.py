"""How a worker reaches the deployment target (``[deploy_target]``), read once at start-up."""

from datetime import timedelta

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import SettingsConfigDict

from onceflow.settings import FileBackedSettings


class DeployTargetSettings(FileBackedSettings):
    """The deployment target's address and the client's timeouts.

    Read from ``DEPLOY_TARGET_URL`` and ``ONCEFLOW_DEPLOY_TARGET_*``; durations are
    ISO 8601 (``PT10S``) or ``HH:MM:SS``. ``account`` is part of every deployment id, so
    it must be the same on every worker. File table: ``[deploy_target]``.
    """

    config_table = "deploy_target"
    model_config = SettingsConfigDict(
        env_prefix="ONCEFLOW_DEPLOY_TARGET_", extra="ignore", frozen=True, populate_by_name=True
    )

    url: str | None = Field(default=None, validation_alias=AliasChoices("DEPLOY_TARGET_URL", "url"))
    """Base URL of the target (``DEPLOY_TARGET_URL``). Default: none, and
    ``start_deployment`` rejects every call with a reason saying so."""
    account: str = Field(default="default", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
    """Which target installation deployment ids are scoped to
    (``ONCEFLOW_DEPLOY_TARGET_ACCOUNT``); identical on every worker. Default ``default``."""
    connect_timeout: timedelta = Field(default=timedelta(seconds=5), gt=timedelta(0))
    """Longest wait to connect (``ONCEFLOW_DEPLOY_TARGET_CONNECT_TIMEOUT``). Default 5 s."""
    request_timeout: timedelta = Field(default=timedelta(seconds=60), gt=timedelta(0))
    """Longest wait for one step's answer (``ONCEFLOW_DEPLOY_TARGET_REQUEST_TIMEOUT``).
    Default 60 s."""

    @field_validator("url")
    @classmethod
    def _no_trailing_slash(cls, value: str | None) -> str | None:
        return value.rstrip("/") if value else None
