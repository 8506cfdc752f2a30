"""What to do after an attempt: the single function the workflow asks.

    attempt outcome ──▶ decide_after_attempt ──▶ RetryStep(delay) | FailStep | ParkStep

``succeeded`` never reaches it: there is nothing to decide.
"""

from collections.abc import Callable
from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict

from onceflow.retry_policy._budget import RetryBudget, StepUsage
from onceflow.retry_policy._outcomes import OutcomeClass


class RetryStep(BaseModel):
    """Try the step again after ``delay`` (slept on a durable timer)."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["retry"] = "retry"
    delay: timedelta
    reason: str


class FailStep(BaseModel):
    """Stop: the step failed and no effect is believed to have happened."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["fail"] = "fail"
    reason: str
    budget_exhausted: bool = False
    """The step stops because the budget ran out (a metric operators page on)."""


class ParkStep(BaseModel):
    """Stop and wait for a person: an effect may have happened and repeating is unsafe."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["park"] = "park"
    reason: str
    budget_exhausted: bool = False
    """The step parks because the budget ran out after an unknown outcome."""


Decision = RetryStep | FailStep | ParkStep


def decide_after_attempt(
    budget: RetryBudget,
    outcome: OutcomeClass,
    usage: StepUsage,
    *,
    safe_repeat_window: timedelta | None,
    random_fraction: Callable[[], float],
) -> Decision:
    """Decide what follows a failed attempt.

    Args:
        budget: The task's retry budget.
        outcome: How the attempt ended; must not be ``succeeded``.
        usage: Attempts and time spent, including this attempt.
        safe_repeat_window: For how much longer repeating the operation is provably
            harmless, once an attempt may have had an effect: ``None`` for always (a
            unique constraint, a local transaction), zero for never (nothing dedupes),
            else what is left of the provider's key retention minus a margin.
        random_fraction: Returns a float in [0, 1); in a workflow, ``workflow.random().random``.

    Returns:
        ``RetryStep`` with a jittered delay, ``FailStep``, or ``ParkStep``.
    """
    if outcome is OutcomeClass.SUCCEEDED:
        raise ValueError("a succeeded attempt needs no decision")
    if outcome is OutcomeClass.REJECTED:
        return FailStep(reason="permanent error: the tool rejected the call, nothing to retry")
    # After any unknown outcome every further attempt is a repeat of an effect that may
    # exist, so safety applies to later transient outcomes too.
    guarded = usage.step_saw_unknown and safe_repeat_window is not None
    if guarded and safe_repeat_window == timedelta(0):
        return ParkStep(reason="outcome unknown and repeating is not provably safe")

    # Waiting for onceflow's own database backs off per consecutive wait and is bounded
    # by the deadline only: the caps bound attempts at the far side.
    backoff = budget.backoff_cap(usage.database_waits or usage.step_attempts)
    delay = timedelta(seconds=random_fraction() * backoff.total_seconds())
    exhausted = None if usage.database_waits else _exhausted_cap(budget, usage)
    if exhausted is None and usage.elapsed + delay >= budget.deadline:
        exhausted = f"the task deadline ({budget.deadline}) would pass before the next attempt"
    if exhausted is not None:
        if usage.step_saw_unknown:
            return ParkStep(
                reason=f"retry budget exhausted after an unknown outcome: {exhausted}",
                budget_exhausted=True,
            )
        return FailStep(reason=f"retry budget exhausted: {exhausted}", budget_exhausted=True)
    if guarded and safe_repeat_window is not None and delay >= safe_repeat_window:
        return ParkStep(
            reason="outcome unknown and the provider may forget the idempotency key "
            "before the next attempt, so repeating is not provably safe"
        )
    return RetryStep(delay=delay, reason=f"{outcome.value} outcome, retrying within budget")


def _exhausted_cap(budget: RetryBudget, usage: StepUsage) -> str | None:
    if usage.task_attempts >= budget.max_attempts_per_task:
        return f"{usage.task_attempts} of {budget.max_attempts_per_task} attempts per task used"
    if usage.step_attempts >= budget.max_attempts_per_step:
        return f"{usage.step_attempts} of {budget.max_attempts_per_step} attempts per step used"
    return None
