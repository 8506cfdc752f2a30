"""What ``start_deployment`` does to the world: a deployment under a lease whose fencing
token the target checks.

A deployment runs for minutes while workers crash and come back. Its operation record
carries a lease and a strictly increasing fencing token (``ChildOperation.fenced_lease``);
an attempt takes the lease only once it is free or expired (token + 1), heartbeats with
its progress, and carries the token on every write to the target, which refuses tokens
older than the highest it has seen; its writes to the ``deployments`` row are fenced by
the token too. A repeat of the step is therefore always safe (``safe_repeat_window`` of a
fenced lease is None), but whether to deploy at all is a person's decision: the step
waits for approval of its exact arguments before the first attempt.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from onceflow.deployments._settings import DeploymentToolSettings
from onceflow.tools import DedupeStrategy, EffectFlags, ToolContract

DEPLOYMENT_STEPS = ("prepare", "roll_out", "verify", "activate")
"""The writes one deployment makes at the target, in order."""


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
