"""What to do after an attempt: the single function the workflow asks.

    attempt outcome ──▶ decide_after_attempt ──▶ RetryStep(delay) | FailStep | ParkStep

``succeeded`` never reaches it: there is nothing to decide.
"""

from collections.abc import Callable
from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict

from retry_policy._budget import RetryBudget, StepUsage
from retry_policy._outcomes import OutcomeClass


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


class ParkStep(BaseModel):
    """Stop and wait for a person: an effect may have happened and repeating is unsafe."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["park"] = "park"
    reason: str


Decision = RetryStep | FailStep | ParkStep


def decide_after_attempt(
    budget: RetryBudget,
    outcome: OutcomeClass,
    usage: StepUsage,
    *,
    repeat_is_safe: bool,
    random_fraction: Callable[[], float],
) -> Decision:
    """Decide what follows a failed attempt.

    Args:
        budget: The task's retry budget.
        outcome: How the attempt ended; must not be ``succeeded``.
        usage: Attempts and time spent, including this attempt.
        repeat_is_safe: Whether the tool's dedupe strategy makes running the same
            operation again provably harmless right now (e.g. the provider still
            remembers the child key).
        random_fraction: Returns a float in [0, 1); in a workflow, ``workflow.random().random``.

    Returns:
        ``RetryStep`` with a jittered delay, ``FailStep``, or ``ParkStep``.
    """
    if outcome is OutcomeClass.SUCCEEDED:
        raise ValueError("a succeeded attempt needs no decision")
    if outcome is OutcomeClass.REJECTED:
        return FailStep(reason="permanent error: the tool rejected the call, nothing to retry")
    if outcome is OutcomeClass.UNKNOWN and not repeat_is_safe:
        return ParkStep(reason="outcome unknown and repeating is not provably safe")

    exhausted = _exhausted_cap(budget, usage)
    delay = timedelta(seconds=random_fraction() * budget.backoff_cap(usage.step_attempts).total_seconds())
    if exhausted is None and usage.elapsed + delay >= budget.deadline:
        exhausted = f"the task deadline ({budget.deadline}) would pass before the next attempt"
    if exhausted is None:
        return RetryStep(delay=delay, reason=f"{outcome.value} outcome, retrying within budget")
    if usage.step_saw_unknown:
        return ParkStep(reason=f"retry budget exhausted after an unknown outcome: {exhausted}")
    return FailStep(reason=f"retry budget exhausted: {exhausted}")


def _exhausted_cap(budget: RetryBudget, usage: StepUsage) -> str | None:
    if usage.task_attempts >= budget.max_attempts_per_task:
        return f"{usage.task_attempts} of {budget.max_attempts_per_task} attempts per task used"
    if usage.step_attempts >= budget.max_attempts_per_step:
        return f"{usage.step_attempts} of {budget.max_attempts_per_step} attempts per step used"
    return None
