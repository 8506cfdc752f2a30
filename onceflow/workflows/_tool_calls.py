"""A step's calls of its tool's activities, as an attempt (``_step_runner``) and a look-up
(``_look_ups``) both make them: the call's input, and its one execution."""

from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    # Summaries are identifiers only: readable in the UI when payloads are encrypted.
    from onceflow.encryption import ClearText
    from onceflow.tools import ToolAttemptResult
    from onceflow.tools.worker import ToolCallInput, ToolPolicy
    from onceflow.workflows.task_models import AgentTaskInput, StepInput, StepStatus
from onceflow.workflows._task_book import ONE_ATTEMPT
from onceflow.workflows.fairness import tenant_priority


def tool_call_input(
    task: AgentTaskInput,
    step: StepInput,
    policy: ToolPolicy,
    status: StepStatus,
    *,
    attempt: int,
    **details: Any,
) -> ToolCallInput:
    """``step``'s call, numbered ``attempt``, with what the step has learnt so far
    (evidence, key generation); ``details`` are the rest of ``ToolCallInput``'s fields:
    an attempt's (``send``) or a look-up's (``claimed_resource_id``)."""
    return ToolCallInput(
        tenant=task.tenant,
        principal=task.principal,
        workflow_id=workflow.info().workflow_id,
        step_id=step.step_id,
        tool=step.tool,
        arguments=step.arguments,
        attempt=attempt,
        evidence=status.evidence,
        policy=policy,
        key_generation=status.key_generation,
        **details,
    )


async def execute_once(
    activity: str,
    call: ToolCallInput,
    summary: str,
    *,
    schedule_to_start_timeout: timedelta | None = None,
    heartbeat_timeout: timedelta | None = None,
) -> ToolAttemptResult:
    """Run ``activity`` once for ``call``, within its policy's attempt timeout: what
    follows its end (or its ``ActivityError``) is the workflow's to decide."""
    result: ToolAttemptResult = await workflow.execute_activity(
        activity,
        call,
        result_type=ToolAttemptResult,
        start_to_close_timeout=call.policy.attempt_timeout,
        schedule_to_start_timeout=schedule_to_start_timeout,
        heartbeat_timeout=heartbeat_timeout,
        retry_policy=ONE_ATTEMPT,
        summary=ClearText(summary),
        priority=tenant_priority(call.tenant),
    )
    return result
