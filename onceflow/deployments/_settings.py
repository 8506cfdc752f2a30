"""The deployment settings: how a worker reaches the target (``[deploy_target]``) and what
the workflow and ``start_deployment`` agree on (``[tools.deployments]``), read at start-up."""

from datetime import timedelta

from pydantic import AliasChoices, Field, field_validator, model_validator
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


class DeploymentToolSettings(FileBackedSettings):
    """What the workflow and ``start_deployment`` need to agree on; same on every worker.

    Read from ``ONCEFLOW_DEPLOYMENTS_*`` and the file's ``[tools.deployments]``; durations
    are ISO 8601 (``PT30S``) or ``HH:MM:SS``. The workflow reads the contract built from
    these values, so every worker must run with the same values.
    """

    config_table = "tools.deployments"
    model_config = SettingsConfigDict(
        env_prefix="ONCEFLOW_DEPLOYMENTS_", extra="ignore", frozen=True
    )

    attempt_timeout: timedelta = Field(default=timedelta(minutes=30), gt=timedelta(0))
    """Longest one attempt may run, waiting for an expired lease included. Default 30 min."""
    heartbeat_timeout: timedelta = Field(default=timedelta(seconds=30), gt=timedelta(0))
    """Longest silence from a running attempt before Temporal ends it and the workflow
    tries again (a dead or paused worker). Default 30 s."""
    lease_ttl: timedelta = Field(default=timedelta(seconds=60), gt=timedelta(0))
    """How long a lease lasts unless its owner extends it (every third of the shorter
    of this and the heartbeat timeout). Another attempt takes over only after it has
    expired. Default 60 s."""

    @model_validator(mode="after")
    def _a_lost_owner_is_noticed_within_an_attempt(self) -> "DeploymentToolSettings":
        if self.heartbeat_timeout >= self.attempt_timeout:
            raise ValueError("heartbeat_timeout must be shorter than attempt_timeout")
        if 2 * self.lease_ttl >= self.attempt_timeout:
            raise ValueError("attempt_timeout must exceed twice lease_ttl (waiting for a lease)")
        return self
