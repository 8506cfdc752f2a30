"""Payment settings pinned per task, judged by the provider's ledger: a task admitted
with one set of values finishes by them on a worker configured differently, and time
spent waiting for a person is not machine budget.

Real ``onceflow worker`` processes, configured only through the environment; tasks are
admitted by a ``TaskClient`` whose catalogue those same settings built, as a gateway's is.
"""

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from onceflow_devstack.stripe_provider import Fault, ProviderControl, RequestRecord
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from onceflow.retry_policy import OutcomeClass, RetryBudget
from onceflow.workflows.task_models import ApproveInput, TaskState, TaskStatus

from .conftest import VISA_CHARGE, AdmittingClient, WorkerProcess, start_task, wait_for

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]

REFUND = {"charge_step": "pay", "amount": 1500, "reason": "requested_by_customer"}
"""15.00 of the 42.00 charge."""
STRICT = {"ONCEFLOW_PAYMENTS_REFUND_APPROVAL_ABOVE": "1000"}
"""A worker on which refunds above 10.00 wait for a person."""
LAX = {"ONCEFLOW_PAYMENTS_REFUND_APPROVAL_ABOVE": "5000"}
"""A worker on which they need nobody up to 50.00."""


def awaiting_approval(status: TaskStatus) -> bool:
    return status.state is TaskState.AWAITING_APPROVAL


def refund_posts(log: list[RequestRecord]) -> list[RequestRecord]:
    return [r for r in log if r.method == "POST" and r.path == "/v1/refunds"]


def approval(status: TaskStatus) -> ApproveInput:
    return ApproveInput(
        step_id="refund",
        approved=True,
        approver="cfo@acme",
        reason="the customer returned the goods",
        arguments_digest=status.step("refund").arguments_digest,
    )


async def test_a_task_finishes_by_the_settings_it_started_with_on_a_differently_set_worker(
    dev_server: WorkflowEnvironment,
    worker_process: WorkerProcess,
    admitting: AdmittingClient,
    control: ProviderControl,
) -> None:
    tasks = admitting(**STRICT)  # a gateway with the strict settings admits the task
    strict = await worker_process(**STRICT)
    workflow_id = await start_task(
        tasks, ("pay", "charge_payment", VISA_CHARGE), ("refund", "refund_payment", REFUND)
    )
    await wait_for(tasks, workflow_id, awaiting_approval)
    strict.terminate()
    await strict.wait()

    await worker_process(**LAX)
    # The new worker replays the task from its first event: it still waits for a person,
    # although a refund of 15.00 needs nobody on this worker.
    waiting = await tasks.status(workflow_id)
    assert awaiting_approval(waiting)
    assert waiting.policies["refund_payment"].approval_above == 1000
    assert [entry.kind for entry in await control.ledger()] == ["charge"]
    assert refund_posts(await control.requests()) == []

    await tasks.approve(workflow_id, approval(waiting))
    result = await tasks.result(workflow_id)

    assert result.state is TaskState.SUCCEEDED, result.failure_reason
    charge, refund = await control.ledger()
    assert (refund.kind, refund.amount, refund.payment_intent) == ("refund", 1500, charge.object_id)
    history = await dev_server.client.get_workflow_handle(workflow_id).fetch_history()
    failed = [
        e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]
    assert failed == []  # no non-determinism on the other worker
    # A task admitted now by a gateway set like the new worker pins its values: no
    # approval.
    fresh = await start_task(
        admitting(**LAX),
        ("pay", "charge_payment", {**VISA_CHARGE, "order_id": "ord-fresh"}),
        ("refund", "refund_payment", REFUND),
    )
    fresh_result = await tasks.result(fresh)
    assert fresh_result.state is TaskState.SUCCEEDED and fresh_result.decisions == []
    assert len(refund_posts(await control.requests())) == 2


async def test_a_refund_approved_after_the_deadline_still_retries_a_rate_limit(
    worker_process: WorkerProcess, admitting: AdmittingClient, control: ProviderControl
) -> None:
    tasks = admitting(**STRICT)
    await worker_process(**STRICT)
    # A deadline the machine's own work (a charge, then a 429 and its retry after the
    # approval) meets with room on one loaded core: 2 s did not there.
    brief = RetryBudget(
        deadline=timedelta(seconds=10),
        initial_backoff=timedelta(milliseconds=100),
        max_backoff=timedelta(milliseconds=200),
    )
    workflow_id = await start_task(
        tasks,
        ("pay", "charge_payment", VISA_CHARGE),
        ("refund", "refund_payment", REFUND),
        budget=brief,
    )
    waiting = await wait_for(tasks, workflow_id, awaiting_approval)
    # The approver answers after the task's whole deadline has gone by (a wall-clock
    # deadline: there is no event to wait on).
    wait = (waiting.budget.deadline_at - datetime.now(UTC)).total_seconds() + 0.5
    await asyncio.sleep(max(wait, 0))  # scenario: the approver answers after the deadline
    await control.add_fault(Fault.RATE_LIMIT_429, path_prefix="/v1/refunds")

    approved_at = datetime.now(UTC)
    await tasks.approve(workflow_id, approval(waiting))
    result = await tasks.result(workflow_id)

    # The 429 is retried: the person's time did not use up the machine's deadline.
    assert result.state is TaskState.SUCCEEDED, result.failure_reason
    attempts = result.step("refund").attempts
    assert [a.outcome for a in attempts] == [OutcomeClass.TRANSIENT, OutcomeClass.SUCCEEDED]
    assert [r.status for r in refund_posts(await control.requests())] == [429, 200]
    assert [(e.kind, e.amount) for e in await control.ledger()] == [
        ("charge", 4200),
        ("refund", 1500),
    ]
    # The scenario held: the approval came after the deadline the task showed while it
    # waited, and that wait is people's time, not the machine's.
    assert approved_at > waiting.budget.deadline_at
    assert result.budget.waited_for_people > timedelta(0)
    assert result.budget.deadline_at > waiting.budget.deadline_at
