"""The in-workflow policy pin, retired behind ``POLICIES_CARRIED`` (patches.py).

Every task and call onceflow admits carries its tools' policies (``AgentTaskInput.policies``,
``CallInput.policy``, resolved once by ``TaskClient`` from the admitting process's
catalogue). Before 0.3.0 a task started without them (by hand, with ``temporal workflow
start``, or by a client that lacked a tool) pinned them here, with the local activity
``pin_task_policy``, on its first workflow task or its call's. New tasks never take this
path: a plan started without policies is refused at its first workflow task, a call
without its policy by the ``call`` validator. What stays is what a task of 0.1.0 or 0.2.0
that pinned this way needs to replay, and what a 0.1.0 open task does live when a call
brings a tool it has not pinned yet (0.1.0 pinned in the Update handler, even for a call
carrying its policy; ``patched`` keeps the answer its replay gave for the whole run).

Only reachable for a task started before 0.3.0 without its policies; goes with
``POLICIES_CARRIED`` (its ``retire_when``), together with ``PolicyPinning``,
``PIN_TASK_POLICY``, ``PinPolicyInput`` and ``TaskPolicy`` in ``onceflow.tools``.
"""

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from onceflow.encryption import ClearText
    from onceflow.tools.worker import PIN_TASK_POLICY, PinPolicyInput, TaskPolicy, ToolPolicy

from onceflow.workflows._task_book import ONE_ATTEMPT, PIN_TIMEOUT, ToolNotOnThisWorker

STARTED_WITHOUT_POLICIES = "StartedWithoutPolicies"
"""Error type failing a plan task started without ``policies``."""


def started_without_policies() -> ApplicationError:
    """The failure of a plan started without its tools' policies, saying what to do."""
    return ApplicationError(
        "this task was started without its tools' policies (AgentTaskInput.policies): "
        "start tasks through onceflow (the HTTP API, the MCP server, the CLI or "
        "onceflow.task_api.TaskClient, which resolve them from the tools' contracts), "
        "or pass `policies` in the start input",
        type=STARTED_WITHOUT_POLICIES,
        non_retryable=True,
    )


def call_without_policy(tool: str) -> str:
    """Why a call that carries no policy for a tool the task has not pinned is refused."""
    return (
        f"the call carries no policy for tool {tool!r} (CallInput.policy): send calls "
        "through onceflow (the HTTP API, the MCP server or onceflow.task_api.TaskClient, "
        "which resolve it from the tool's contract)"
    )


async def pin_policies_as_before_0_3_0(tools: list[str]) -> dict[str, ToolPolicy]:
    """Resolve the tools' policies with the local activity ``pin_task_policy``, as every
    task started without them did before 0.3.0: Temporal recorded its answer, and every
    replay reads it from history."""
    try:
        pinned: TaskPolicy = await workflow.execute_local_activity(
            PIN_TASK_POLICY,
            PinPolicyInput(tools=tools),
            result_type=TaskPolicy,
            start_to_close_timeout=PIN_TIMEOUT,
            retry_policy=ONE_ATTEMPT,
            summary=ClearText("pin the task's policy"),
        )
    except (ActivityError, ApplicationError) as failure:
        # A local activity's failure may arrive unwrapped.
        cause = failure.cause if isinstance(failure, ActivityError) else failure
        if isinstance(cause, ApplicationError) and cause.type == "ToolNotOnThisWorker":
            # Fail the workflow task (Temporal retries it) until a worker with the
            # tool pins the policy; nothing is recorded, nothing fails for good.
            raise ToolNotOnThisWorker(cause.message) from None
        raise ToolNotOnThisWorker(
            f"this worker could not pin the task's policy ({type(cause).__name__}: "
            f"{cause}); build workers with onceflow.worker.build_worker, which "
            "registers pin_task_policy"
        ) from None
    return dict(pinned.tools)
