"""The baseline every onceflow benchmark compares to: a bare workflow with a no-op activity.

Kept in its own module because Temporal's workflow sandbox re-imports a workflow's
module, which it cannot do for a script run as ``__main__``.
"""

from datetime import timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy


@activity.defn
async def no_op(value: str) -> str:
    return value


@workflow.defn
class BareWorkflow:
    @workflow.run
    async def run(self, value: str) -> str:
        return await workflow.execute_activity(
            no_op,
            value,
            start_to_close_timeout=timedelta(seconds=15),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )


@workflow.defn
class BareWaitingWorkflow:
    """The memory baseline: a bare workflow that stays open until signalled."""

    def __init__(self) -> None:
        self._released = False

    @workflow.run
    async def run(self, value: str) -> str:
        await workflow.wait_condition(lambda: self._released)
        return value

    @workflow.signal
    def release(self) -> None:
        self._released = True


@workflow.defn
class BareUpdateWorkflow:
    """The per-call baseline of an open task: a bare workflow that stays open and answers
    each ``call`` Update by running one no-op activity, until ``close``."""

    def __init__(self) -> None:
        self._calls = 0
        self._closed = False

    @workflow.run
    async def run(self) -> int:
        await workflow.wait_condition(lambda: self._closed and workflow.all_handlers_finished())
        return self._calls

    @workflow.update
    async def call(self, value: str) -> str:
        self._calls += 1
        return await workflow.execute_activity(
            no_op,
            value,
            start_to_close_timeout=timedelta(seconds=15),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )

    @workflow.update
    def close(self) -> int:
        self._closed = True
        return self._calls


@activity.defn
async def unknown_outcome(value: str) -> str:
    """A send whose answer never came: the outcome is unknown."""
    return f"unknown: {value}"


@workflow.defn
class BareReconciledWorkflow:
    """The parked-then-reconciled baseline: one attempt whose outcome is unknown, then
    wait for an operator's ``reconcile`` Update, whose decision is the result."""

    def __init__(self) -> None:
        self._decision: str | None = None

    @workflow.run
    async def run(self, value: str) -> str:
        await workflow.execute_activity(
            unknown_outcome,
            value,
            start_to_close_timeout=timedelta(seconds=15),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )
        await workflow.wait_condition(lambda: self._decision is not None)
        assert self._decision is not None
        return self._decision

    @workflow.update
    def reconcile(self, decision: str) -> str:
        self._decision = decision
        return decision


@workflow.defn
class BareApprovalWorkflow:
    """The approval baseline: wait for a person's ``approve`` Update, then run the one
    activity (nothing when denied)."""

    def __init__(self) -> None:
        self._approved: bool | None = None

    @workflow.run
    async def run(self, value: str) -> str:
        await workflow.wait_condition(lambda: self._approved is not None)
        if not self._approved:
            return "denied"
        return await workflow.execute_activity(
            no_op,
            value,
            start_to_close_timeout=timedelta(seconds=15),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )

    @workflow.update
    def approve(self, approved: bool) -> bool:
        self._approved = approved
        return approved
