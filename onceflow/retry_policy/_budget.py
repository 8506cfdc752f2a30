"""The retry budget: one allowance of attempts, backoff and time for a whole task."""

from datetime import timedelta

from pydantic import BaseModel, ConfigDict, Field, model_validator


class RetryBudget(BaseModel):
    """How much retrying a whole task may do; held by the workflow, never by a client.

    Backoff is capped exponential with full jitter: before the n-th repeat of a step the
    workflow sleeps a uniformly drawn fraction of
    ``min(max_backoff, initial_backoff * backoff_multiplier ** (n - 1))``.

    The deadline counts machine time only: time the task spends running attempts and
    backing off. Time a step spends awaiting a person's approval or parked for a
    reconciliation does not count, so a refund approved a day later still gets its
    retries (a task started before this rule counts wall time, as it did then).

    An attempt that ended because onceflow's own database was unreachable counts
    against the deadline but not the attempt caps: the step waits for the database
    (backing off per consecutive such attempt) instead of spending its budget, so a
    database restart or a 30-second outage never fails or parks a task.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_attempts_per_task: int = Field(default=12, ge=1, le=1000)
    """Attempts across all steps of the task, operator-authorised ones excluded; in an
    open task, whose calls are as many as the agent's model makes, only retries (every
    attempt of a call after its first). Default 12."""
    max_attempts_per_step: int = Field(default=5, ge=1, le=100)
    """Attempts of any one step, operator-authorised ones excluded. Default 5."""
    deadline: timedelta = Field(default=timedelta(hours=1), gt=timedelta(0))
    """No automatic retry starts once the task has spent this much machine time (running
    and backing off, not awaiting approval or parked). Default 1 hour."""
    initial_backoff: timedelta = Field(default=timedelta(seconds=1), gt=timedelta(0))
    """Backoff cap before the first repeat of a step. Default 1 second."""
    max_backoff: timedelta = Field(default=timedelta(minutes=1), gt=timedelta(0))
    """Largest backoff cap, however many repeats. Default 1 minute."""
    backoff_multiplier: float = Field(default=2.0, ge=1.0, le=10.0)
    """Growth of the backoff cap per repeat. Default 2.0."""

    @model_validator(mode="after")
    def _caps_are_consistent(self) -> "RetryBudget":
        if self.max_attempts_per_step > self.max_attempts_per_task:
            raise ValueError("max_attempts_per_step cannot exceed max_attempts_per_task")
        if self.initial_backoff > self.max_backoff:
            raise ValueError("initial_backoff cannot exceed max_backoff")
        return self

    def backoff_cap(self, step_attempts: int) -> timedelta:
        """The largest delay before the next repeat of a step tried ``step_attempts`` times."""
        exponent = max(step_attempts - 1, 0)
        # Compare in float seconds and clamp before building a timedelta, so a large
        # exponent cannot overflow.
        cap = self.initial_backoff.total_seconds() * self.backoff_multiplier ** min(exponent, 64)
        return timedelta(seconds=min(cap, self.max_backoff.total_seconds()))

    @property
    def longest_retry_window(self) -> timedelta:
        """How much machine time after a task starts an automatic retry may still happen
        (time awaiting approval or parked comes on top)."""
        return self.deadline + self.max_backoff


class StepUsage(BaseModel):
    """What a task has spent so far, as seen when deciding about one step."""

    model_config = ConfigDict(frozen=True)

    task_attempts: int = Field(ge=0)
    """Budgeted attempts made by the whole task, including the one just finished."""
    step_attempts: int = Field(ge=0)
    """Budgeted attempts made by this step, including the one just finished."""
    elapsed: timedelta
    """Machine time since the task started: running and backing off, not awaiting
    approval or parked."""
    step_saw_unknown: bool = False
    """Whether any attempt of this step ended ``unknown`` (this one included)."""
    database_waits: int = Field(default=0, ge=0)
    """Consecutive attempts of this step, up to the one just finished, that ended
    because onceflow's database was unreachable; they are not in the attempt counts."""
