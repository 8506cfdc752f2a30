"""The local activity that pins a task's policy: the one place a task reads this worker's
tool settings, once, on its first workflow task; Temporal records the answer in the
task's history, so every later replay, on any worker, decides from the same values."""

from temporalio import activity
from temporalio.exceptions import ApplicationError

from onceflow.tools._catalogue import CATALOGUE, Catalogue, UnknownTool
from onceflow.tools._policy import PIN_TASK_POLICY, PinPolicyInput, TaskPolicy, ToolPolicy

TOOL_NOT_ON_THIS_WORKER = "ToolNotOnThisWorker"
"""Error type of a pinning refused because this worker does not know one of the tools."""


class PolicyPinning:
    """Resolves tasks' policies from a catalogue (a worker registers ``pin_task_policy``)."""

    def __init__(self, catalogue: Catalogue = CATALOGUE) -> None:
        self._catalogue = catalogue

    @activity.defn(name=PIN_TASK_POLICY)
    async def pin_task_policy(self, request: PinPolicyInput) -> TaskPolicy:
        """Every named tool's ``ToolPolicy`` under this worker's contracts.

        Raises:
            ApplicationError: ``ToolNotOnThisWorker``, non-retryable, when a tool is not
                registered here; the workflow task fails and another worker pins instead.
        """
        policies: dict[str, ToolPolicy] = {}
        for name in request.tools:
            try:
                policies[name] = self._catalogue.get(name).policy()
            except UnknownTool:
                raise ApplicationError(
                    f"tool {name!r} is not registered on this worker; load it on every "
                    "worker of the task queue (ONCEFLOW_TOOLS)",
                    type=TOOL_NOT_ON_THIS_WORKER,
                    non_retryable=True,
                ) from None
        return TaskPolicy(tools=policies)
