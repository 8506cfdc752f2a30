"""onceflow's deployment integration: a target reached over HTTP with fenced writes.

The ``start_deployment`` activity holds a lease on the deployment's row in PostgreSQL
with a strictly increasing fencing token and carries that token on every write to the
target (``DeployTarget``), which refuses any token older than the highest it has seen.
Nothing here imports the dev stack; point ``DEPLOY_TARGET_URL`` at any target that
speaks the contract in ``deployments._target``.
"""

from onceflow.deployments._settings import DeployTargetSettings
from onceflow.deployments._target import (
    STALE_TOKEN,
    DeployTarget,
    DeployTargetError,
    HttpDeployTarget,
    StepWrite,
    open_deploy_target,
)

__all__ = [
    "STALE_TOKEN",
    "DeployTarget",
    "DeployTargetError",
    "DeployTargetSettings",
    "HttpDeployTarget",
    "StepWrite",
    "open_deploy_target",
]
