"""Look-ups: asking a tool's provider whether a step's effect happened, before parking
or to check an operator's decision."""

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    # Summaries are identifiers only: readable in the UI when payloads are encrypted.
    from onceflow.encryption import ClearText
    from onceflow.retry_policy import OutcomeClass
    from onceflow.tools import ToolAttemptResult
    from onceflow.tools.worker import ToolCallInput, ToolPolicy
    from onceflow.workflows.task_models import StepInput, StepStatus
from onceflow.workflows._task_book import ONE_ATTEMPT, TaskBook, describe_activity_failure
from onceflow.workflows.fairness import tenant_priority


class LookUps:
    """Runs a step's look-up activity and records what it found in the step's evidence."""

    def __init__(self, book: TaskBook) -> None:
        self._task = book.task
        self._memory = book.memory

    async def look_up(
        self,
        step: StepInput,
        policy: ToolPolicy,
        status: StepStatus,
        *,
        claimed_resource_id: str | None = None,
        accept_unverified: bool = False,
        why: str = "before parking",
    ) -> ToolAttemptResult | None:
        """Ask the provider (strongly consistent reads first) if it happened: before
        parking, or to check an operator's decision (``claimed_resource_id``: the
        resource an operator says the step made). The effect found, or None."""
        answer = await self.ask(
            step,
            policy,
            status,
            claimed_resource_id=claimed_resource_id,
            accept_unverified=accept_unverified,
            why=why,
        )
        return answer if answer is not None and answer.outcome is OutcomeClass.SUCCEEDED else None

    async def ask(
        self,
        step: StepInput,
        policy: ToolPolicy,
        status: StepStatus,
        *,
        claimed_resource_id: str | None = None,
        accept_unverified: bool = False,
        why: str,
    ) -> ToolAttemptResult | None:
        """The look-up's answer (a miss too, saying what it proves), or None when the
        tool has no look-up or it could not run."""
        if policy.lookup_activity is None:
            return None
        call = ToolCallInput(
            tenant=self._task.tenant,
            principal=self._task.principal,
            workflow_id=workflow.info().workflow_id,
            step_id=step.step_id,
            tool=step.tool,
            arguments=step.arguments,
            attempt=len(status.attempts),
            evidence=status.evidence,
            policy=policy,
            key_generation=status.key_generation,
            claimed_resource_id=claimed_resource_id,
            accept_unverified=accept_unverified,
            last_attempt_ended_at=status.attempts[-1].finished_at if status.attempts else None,
        )
        try:
            found: ToolAttemptResult = await workflow.execute_activity(
                policy.lookup_activity,
                call,
                result_type=ToolAttemptResult,
                start_to_close_timeout=policy.attempt_timeout,
                retry_policy=ONE_ATTEMPT,
                summary=ClearText(f"look up step {step.step_id}'s effect {why}"),
                priority=tenant_priority(self._task.tenant),
            )
        except ActivityError as failure:
            status.evidence["lookup"] = describe_activity_failure(failure)
            return None
        status.evidence.update(found.evidence)
        if found.outcome is not OutcomeClass.SUCCEEDED:
            status.evidence["lookup"] = found.reason or "inconclusive"
        return found
