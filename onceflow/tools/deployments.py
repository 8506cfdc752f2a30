"""The ``start_deployment`` tool: a lease with a fencing token the target checks.

A deployment runs for minutes while workers crash and come back. Its row in PostgreSQL
carries a lease (``lease_expires_at``) and a strictly increasing fencing token; an
attempt takes the lease only once it is free or expired (token + 1), heartbeats with its
progress, and carries the token on every write to the target, which refuses tokens
older than the highest it has seen; the local commit checks the token too. A repeat of
the step is therefore always safe (``safe_repeat_window`` of a fenced lease is None),
but whether to deploy at all is a person's decision: the step waits for approval of its
exact arguments before the first attempt.

Configuration (``DeploymentToolSettings``) is read from the environment and the
configuration file's ``[tools.deployments]`` once, at import; the workflow reads these
contracts, so every worker must run with the same values.
"""

from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import SettingsConfigDict

from onceflow.settings import FileBackedSettings, read_settings
from onceflow.tools._contract import DedupeStrategy, EffectFlags, ToolContract

DEPLOY_CHILD_OP = "deploy"
"""Child operation name of a deployment in its derived key (the deployment id)."""
DEPLOYMENT_STEPS = ("prepare", "roll_out", "verify", "activate")
"""The writes one deployment makes at the target, in order."""


class DeploymentToolSettings(FileBackedSettings):
    """What the workflow and the deployment activity need to agree on; same on every worker.

    Read from ``ONCEFLOW_DEPLOYMENTS_*`` and the file's ``[tools.deployments]``; durations
    are ISO 8601 (``PT30S``) or ``HH:MM:SS``.
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

    @property
    def keep_alive_every(self) -> timedelta:
        """How often a running attempt heartbeats and extends its lease."""
        return min(self.lease_ttl, self.heartbeat_timeout) / 3


class StartDeploymentInput(BaseModel):
    """Deploy one version of one service to one environment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    service: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    """The service to deploy."""
    version: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
    """The version (tag or build id) to roll out."""
    environment: Literal["staging", "production"]
    """Where to deploy it."""


def start_deployment_contract(
    settings: DeploymentToolSettings, *, name: str = "start_deployment"
) -> ToolContract:
    """The ``start_deployment`` contract under ``settings`` (``name`` for test variants)."""
    return ToolContract(
        name=name,
        description=(
            "Deploy a version of a service after a person approves the exact arguments; "
            "one deployment per call, fenced so a stale worker cannot write."
        ),
        input_model=StartDeploymentInput,
        # Destructive: it replaces the running version. Not idempotent: another call
        # (another task) rolls the service out again, restarting it. Open world: it
        # writes to a deployment target outside onceflow's database.
        effects=EffectFlags(read_only=False, destructive=True, idempotent=False, open_world=True),
        dedupe=DedupeStrategy.FENCED_LEASE,
        start_to_close_timeout=settings.attempt_timeout,
        heartbeat_timeout=settings.heartbeat_timeout,
        requires_approval=True,
    )


DEPLOYMENT_TOOL_SETTINGS = read_settings(DeploymentToolSettings)
"""The settings every worker read at import; the contract below is built from them."""
START_DEPLOYMENT = start_deployment_contract(DEPLOYMENT_TOOL_SETTINGS)
