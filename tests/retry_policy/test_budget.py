"""RetryBudget and decide_after_attempt: caps, delays and the park/fail rules."""

import random
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from onceflow.retry_policy import (
    FailStep,
    OutcomeClass,
    ParkStep,
    RetryBudget,
    RetryStep,
    StepUsage,
    decide_after_attempt,
)

budgets = st.builds(
    lambda per_task, per_step, initial, extra, multiplier, deadline: RetryBudget(
        max_attempts_per_task=per_task,
        max_attempts_per_step=min(per_step, per_task),
        initial_backoff=timedelta(seconds=initial),
        max_backoff=timedelta(seconds=initial + extra),
        backoff_multiplier=multiplier,
        deadline=timedelta(seconds=deadline),
    ),
    st.integers(1, 50),
    st.integers(1, 20),
    st.floats(0.001, 30),
    st.floats(0, 600),
    st.floats(1, 10),
    st.floats(1, 86_400),
)
retryable = st.sampled_from([OutcomeClass.TRANSIENT, OutcomeClass.UNKNOWN])
windows = st.one_of(st.none(), st.timedeltas(timedelta(0), timedelta(days=2)))


@given(budgets, retryable, windows, st.integers(0, 10_000), st.data())
def test_a_budget_is_never_exceeded_and_delays_stay_in_bounds(
    budget: RetryBudget,
    outcome: OutcomeClass,
    window: timedelta | None,
    seed: int,
    data: st.DataObject,
) -> None:
    """Simulate a task of several steps and check every cap on every decision."""
    rng = random.Random(seed)
    task_attempts = 0
    elapsed = timedelta(0)
    steps = data.draw(st.integers(1, 6))
    for _ in range(steps):
        step_attempts = 0
        while True:
            task_attempts += 1
            step_attempts += 1
            assert task_attempts <= budget.max_attempts_per_task
            assert step_attempts <= budget.max_attempts_per_step
            usage = StepUsage(
                task_attempts=task_attempts,
                step_attempts=step_attempts,
                elapsed=elapsed,
                step_saw_unknown=outcome is OutcomeClass.UNKNOWN,
            )
            decision = decide_after_attempt(
                budget, outcome, usage, safe_repeat_window=window, random_fraction=rng.random
            )
            if not isinstance(decision, RetryStep):
                break
            assert timedelta(0) <= decision.delay <= budget.backoff_cap(step_attempts)
            assert decision.delay <= budget.max_backoff
            elapsed += decision.delay
            assert elapsed < budget.deadline
            if outcome is OutcomeClass.UNKNOWN and window is not None:
                assert decision.delay < window
        if isinstance(decision, FailStep):
            assert outcome is OutcomeClass.TRANSIENT
            return
        assert isinstance(decision, ParkStep) and outcome is OutcomeClass.UNKNOWN
        return


@given(budgets, st.integers(1, 200))
def test_the_backoff_cap_grows_then_stops_at_the_maximum(
    budget: RetryBudget, attempts: int
) -> None:
    cap = budget.backoff_cap(attempts)
    assert budget.initial_backoff - timedelta(microseconds=1) <= cap <= budget.max_backoff
    assert budget.backoff_cap(attempts + 1) >= cap


def decide(outcome: OutcomeClass, *, window: timedelta | None = None, **usage: object) -> object:
    fields: dict[str, object] = {"task_attempts": 1, "step_attempts": 1, "elapsed": timedelta(0)}
    fields.update(usage)
    return decide_after_attempt(
        RetryBudget(),
        outcome,
        StepUsage.model_validate(fields),
        safe_repeat_window=window,
        random_fraction=lambda: 0.5,
    )


def test_rejected_fails_at_once() -> None:
    assert isinstance(decide(OutcomeClass.REJECTED), FailStep)


def test_unknown_parks_when_nothing_dedupes_a_repeat() -> None:
    decision = decide(OutcomeClass.UNKNOWN, window=timedelta(0), step_saw_unknown=True)
    assert isinstance(decision, ParkStep)


def test_unknown_parks_when_the_key_would_be_forgotten_before_the_retry() -> None:
    decision = decide(OutcomeClass.UNKNOWN, window=timedelta(milliseconds=1), step_saw_unknown=True)
    assert isinstance(decision, ParkStep)
    assert "forget" in decision.reason


def test_a_transient_outcome_after_an_unknown_one_is_still_guarded() -> None:
    decision = decide(OutcomeClass.TRANSIENT, window=timedelta(0), step_saw_unknown=True)
    assert isinstance(decision, ParkStep)


def test_exhaustion_after_only_transient_outcomes_fails() -> None:
    decision = decide(OutcomeClass.TRANSIENT, task_attempts=12, step_attempts=5)
    assert isinstance(decision, FailStep)
    assert "exhausted" in decision.reason


def test_exhaustion_after_an_unknown_outcome_parks() -> None:
    decision = decide(
        OutcomeClass.UNKNOWN, window=None, task_attempts=12, step_attempts=5, step_saw_unknown=True
    )
    assert isinstance(decision, ParkStep)


def test_no_retry_would_start_after_the_deadline() -> None:
    decision = decide(OutcomeClass.TRANSIENT, elapsed=timedelta(minutes=59, seconds=59.9))
    assert isinstance(decision, FailStep)
    assert "deadline" in decision.reason


def test_succeeded_needs_no_decision() -> None:
    with pytest.raises(ValueError):
        decide(OutcomeClass.SUCCEEDED)


@pytest.mark.parametrize(
    "fields",
    [
        {"max_attempts_per_task": 0},
        {"max_attempts_per_step": 6, "max_attempts_per_task": 5},
        {"initial_backoff": timedelta(minutes=2)},
        {"deadline": timedelta(0)},
        {"surprise": 1},
    ],
)
def test_an_inconsistent_budget_is_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RetryBudget.model_validate(fields)


@pytest.mark.parametrize("attempt_seconds", [0.05, 10.0])
@pytest.mark.parametrize("fraction", [0.0, 0.5, 0.999])
def test_the_default_budget_waits_out_a_30_second_database_outage(
    attempt_seconds: float, fraction: float
) -> None:
    # Attempts fail fast (connection refused) or after the pool's 10 s wait, for 30 s,
    # on a step and a task whose caps are already all but spent.
    budget = RetryBudget()
    elapsed, waits = timedelta(0), 0
    while elapsed < timedelta(seconds=30):
        elapsed += timedelta(seconds=attempt_seconds)
        waits += 1
        decision = decide_after_attempt(
            budget,
            OutcomeClass.TRANSIENT,
            StepUsage(
                task_attempts=budget.max_attempts_per_task - 1,
                step_attempts=budget.max_attempts_per_step - 1,
                elapsed=elapsed,
                database_waits=waits,
            ),
            safe_repeat_window=None,
            random_fraction=lambda: fraction,
        )
        assert isinstance(decision, RetryStep), (waits, decision)
        assert decision.delay <= budget.backoff_cap(waits)
        elapsed += decision.delay
    # The same attempts charged to the caps would have ended the step at once.
    charged = decide(
        OutcomeClass.TRANSIENT,
        task_attempts=budget.max_attempts_per_task,
        step_attempts=budget.max_attempts_per_step,
    )
    assert isinstance(charged, FailStep)


def test_waiting_for_the_database_stops_at_the_deadline() -> None:
    budget = RetryBudget(deadline=timedelta(minutes=5))
    decision = decide_after_attempt(
        budget,
        OutcomeClass.TRANSIENT,
        StepUsage(
            task_attempts=0, step_attempts=0, elapsed=timedelta(minutes=5), database_waits=40
        ),
        safe_repeat_window=None,
        random_fraction=lambda: 0.5,
    )
    assert isinstance(decision, FailStep) and "deadline" in decision.reason
