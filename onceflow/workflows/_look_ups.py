"""Look-ups: asking a tool's provider whether a step's effect happened, before parking
or to check an operator's decision."""

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from onceflow.retry_policy import OutcomeClass
    from onceflow.tools import ToolAttemptResult
    from onceflow.tools.worker import ToolPolicy
    from onceflow.workflows.task_models import StepInput, StepStatus
from onceflow.workflows._task_book import TaskBook, describe_activity_failure
from onceflow.workflows._tool_calls import execute_once, tool_call_input


class LookUps:
    """Runs a step's look-up activity and records what it found in the step's evidence."""

    # One per cached task: slots, no attribute dict to hold.
    __slots__ = ("_task", "_memory")

    def __init__(self, book: TaskBook) -> None:
        self._task = book.task
        self._memory = book.memory

    async def look_up(
        self,
        step: StepInput,
        policy: ToolPolicy,
        status: StepStatus,
        *,
        why: str = "before parking",
    ) -> ToolAttemptResult | None:
        """Ask the provider (strongly consistent reads first) if it happened, before
        parking: the effect found, or None."""
        return effect_found(await self.ask(step, policy, status, why=why))

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
        call = tool_call_input(
            self._task,
            step,
            policy,
            status,
            attempt=len(status.attempts),
            claimed_resource_id=claimed_resource_id,
            accept_unverified=accept_unverified,
            last_attempt_ended_at=status.attempts[-1].finished_at if status.attempts else None,
        )
        try:
            found = await execute_once(
                policy.lookup_activity, call, f"look up step {step.step_id}'s effect {why}"
            )
        except ActivityError as failure:
            status.evidence["lookup"] = describe_activity_failure(failure)
            return None
        status.evidence.update(found.evidence)
        if found.outcome is not OutcomeClass.SUCCEEDED:
            status.evidence["lookup"] = found.reason or "inconclusive"
        return found


def effect_found(answer: ToolAttemptResult | None) -> ToolAttemptResult | None:
    """A look-up's answer when it found the effect, else None."""
    return answer if answer is not None and answer.outcome is OutcomeClass.SUCCEEDED else None
