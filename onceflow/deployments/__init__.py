"""The ``start_deployment`` tool: a deployment target reached over HTTP with fenced writes,
built on the public tool API like any user's tool.

``deployment_tools(tool_settings, target)`` returns it. Its perform holds the
operation's fenced lease (``ChildOperation.fenced_lease``) and carries the fencing token
on every write to the target (``DeployTarget``), which refuses any token older than the
highest it has seen; its writes to the ``deployments`` row are fenced the same way
(``fenced_transaction``). Nothing here imports the dev stack; point ``DEPLOY_TARGET_URL``
at any target that speaks the contract in ``deployments._target``.
"""

from functools import partial

from onceflow.deployments._contract import (
    DEPLOYMENT_STEPS,
    StartDeploymentInput,
    start_deployment_contract,
)
from onceflow.deployments._perform import DEPLOY_CHILD_OP, FencedDeploying
from onceflow.deployments._settings import DeploymentToolSettings, DeployTargetSettings
from onceflow.deployments._target import (
    STALE_TOKEN,
    DeployTarget,
    DeployTargetError,
    HttpDeployTarget,
    StepWrite,
    open_deploy_target,
)
from onceflow.settings import SettingsSource
from onceflow.tools import StartupProblem, Tool, ToolFamily

__all__ = [
    "DEPLOYMENT_STEPS",
    "DEPLOY_CHILD_OP",
    "STALE_TOKEN",
    "DeployTarget",
    "DeployTargetError",
    "DeployTargetSettings",
    "DeploymentToolSettings",
    "HttpDeployTarget",
    "StartDeploymentInput",
    "StepWrite",
    "deployment_family",
    "deployment_tools",
    "open_deploy_target",
    "start_deployment_contract",
]


def deployment_tools(
    tool_settings: DeploymentToolSettings, target: DeployTargetSettings
) -> tuple[Tool, ...]:
    """The deployment family's tools: ``start_deployment``.

    Its client is the ``HttpDeployTarget`` of ``target`` (no retries, explicit
    timeouts), or None without ``DEPLOY_TARGET_URL``, in which case every call is
    rejected with a reason saying so.

    Args:
        tool_settings: What the workflow and the perform agree on (``[tools.deployments]``);
            the same on every worker.
        target: How this worker reaches the target (``[deploy_target]``).
    """
    deploying = FencedDeploying(tool_settings)
    return (
        Tool(
            contract=start_deployment_contract(tool_settings),
            perform=deploying.start_deployment,
            open_client=partial(open_deploy_target, target),
        ),
    )


def deployment_family(settings: SettingsSource) -> ToolFamily:
    """The deployment family as every process loads it: ``start_deployment`` under
    ``[tools.deployments]`` and ``[deploy_target]``, needing ``DEPLOY_TARGET_URL`` to start."""
    target = settings.read(DeployTargetSettings)
    tools = deployment_tools(settings.read(DeploymentToolSettings), target)
    missing = StartupProblem(
        tools=tuple(tool.name for tool in tools),
        problem="DEPLOY_TARGET_URL is not set",
        fix="set it to your deployment target's URL",
    )
    return ToolFamily(
        name="deployments", tools=tools, problems=() if target.url is not None else (missing,)
    )
