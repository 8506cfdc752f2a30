"""Operator decisions checked before they act (invariant 16), judged by the provider's
ledger and request log: ``did_not_happen`` looks the charge up first, ``happened`` is
verified by retrieving the named PaymentIntent and recorded where a later refund reads it."""

import pytest
from onceflow_devstack.stripe_provider import Fault, ProviderControl, RequestRecord
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.payments import ChargeRequest, StripePaymentProvider
from onceflow.task_api import DecisionRefused, TaskClient
from onceflow.tools.worker import derive_child_key
from onceflow.workflows.task_models import (
    ReconcileDecision,
    ReconcileInput,
    StepState,
    TaskState,
    TaskStatus,
)
from tests.harness import key_window_closed

from .conftest import (
    ACCOUNT,
    FAST_BUDGET,
    SHORT_RETENTION_CHARGE,
    TENANT,
    VISA_CHARGE,
    operation_row,
    start_task,
    wait_for,
)

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]

REFUND_BY_STEP = {"charge_step": "pay", "amount": 1500, "reason": "requested_by_customer"}


def charge_key(workflow_id: str) -> str:
    return derive_child_key(
        tenant=TENANT,
        workflow_id=workflow_id,
        step_id="pay",
        child_op="charge",
        provider_account=ACCOUNT,
    )


def posts(log: list[RequestRecord], path: str = "/v1/payment_intents") -> list[RequestRecord]:
    return [record for record in log if record.method == "POST" and record.path == path]


def parked(status: TaskStatus) -> bool:
    return status.state is TaskState.PARKED


def decide(
    decision: ReconcileDecision, resource_id: str | None = None, **more: bool
) -> ReconcileInput:
    return ReconcileInput(
        step_id="pay",
        decision=decision,
        resource_id=resource_id,
        operator="ops@acme",
        reason="checked the dashboard",
        **more,
    )


async def park_a_charge_that_happened(
    control: ProviderControl, tasks: TaskClient, *more_steps: tuple[str, str, dict[str, object]]
) -> str:
    """A charge Stripe made but answered 500 for (stored under the key) while its reads
    failed (503) and its search index lags an hour: the step parks although the
    PaymentIntent exists. The reads are back once it parked; search still lags."""
    await control.configure(search_lag_seconds=3600)
    await control.add_fault(Fault.ERROR_500_AFTER_COMMIT, path_prefix="/v1/payment_intents")
    await control.add_fault(
        Fault.ERROR_503, method="GET", path_prefix="/v1/payment_intents", times=None
    )
    workflow_id = await start_task(tasks, ("pay", "charge_payment", VISA_CHARGE), *more_steps)
    await wait_for(tasks, workflow_id, parked)
    await control.clear_faults()
    return workflow_id


async def test_happened_is_verified_and_recorded_so_a_refund_by_charge_step_refunds_once(
    worker: Worker, tasks: TaskClient, control: ProviderControl, database: str
) -> None:
    workflow_id = await park_a_charge_that_happened(
        control, tasks, ("refund", "refund_payment", REFUND_BY_STEP)
    )
    [charge] = await control.ledger()

    answer = await tasks.reconcile(
        workflow_id, decide(ReconcileDecision.HAPPENED, charge.object_id)
    )

    assert f"succeeds with resource {charge.object_id}" in answer.message
    result = await tasks.result(workflow_id)
    assert result.state is TaskState.SUCCEEDED, result.failure_reason
    # The decision reached the operation record the refund reads.
    assert operation_row(database, charge_key(workflow_id))[:2] == ("succeeded", charge.object_id)
    [recorded] = result.decisions
    assert recorded.verified is True and charge.object_id in (recorded.finding or "")
    assert result.step("pay").result["amount"] == 4200
    ledger = await control.ledger()
    assert [(entry.kind, entry.amount) for entry in ledger] == [("charge", 4200), ("refund", 1500)]
    assert ledger[1].payment_intent == charge.object_id
    assert len(posts(await control.requests(), "/v1/refunds")) == 1
    # The charge's POST, and its one same-key repeat that showed the 500 was stored.
    assert [r.outcome for r in posts(await control.requests())] == ["executed", "replayed"]


async def test_happened_naming_an_unknown_or_foreign_id_is_refused_unless_unverified(
    worker: Worker, tasks: TaskClient, control: ProviderControl, database: str
) -> None:
    workflow_id = await park_a_charge_that_happened(control, tasks)
    other = await start_task(tasks, ("pay", "charge_payment", {**VISA_CHARGE, "order_id": "o-2"}))
    await control.clear_faults()
    foreign = (await tasks.result(other)).step("pay").resource_id
    assert foreign is not None

    with pytest.raises(DecisionRefused, match="pi_does_not_exist"):
        await tasks.reconcile(workflow_id, decide(ReconcileDecision.HAPPENED, "pi_does_not_exist"))
    with pytest.raises(DecisionRefused, match="not this step's charge"):
        await tasks.reconcile(workflow_id, decide(ReconcileDecision.HAPPENED, foreign))

    status = await tasks.status(workflow_id)
    assert status.state is TaskState.PARKED and status.decisions == []
    # The operator insists: accepted, and the record says it was not verified.
    await tasks.reconcile(
        workflow_id, decide(ReconcileDecision.HAPPENED, "pi_does_not_exist", unverified=True)
    )
    result = await tasks.result(workflow_id)
    assert result.state is TaskState.SUCCEEDED
    assert result.step("pay").result == {"reconciled": True}
    [recorded] = result.decisions
    assert recorded.accepted and recorded.verified is False
    assert "pi_does_not_exist" in (recorded.finding or result.step("pay").evidence["lookup"])
    # The parked task's POST and its replayed repeat, the other task's: nothing more.
    assert len(posts(await control.requests())) == 3
    # Kept where later steps read the step's charge, as the operator insisted.
    assert operation_row(database, charge_key(workflow_id))[:2] == (  # type: ignore[index]
        "succeeded",
        "pi_does_not_exist",
    )


async def test_a_charge_made_by_hand_accepted_unverified_is_refunded_by_charge_step(
    worker: Worker,
    tasks: TaskClient,
    control: ProviderControl,
    payment_provider: StripePaymentProvider,
) -> None:
    # The step's key holds a stored 500 and nothing was charged; the operator charges
    # the customer by hand in the dashboard (no onceflow operation id on it).
    await control.add_fault(Fault.ERROR_500_BEFORE_COMMIT, path_prefix="/v1/payment_intents")
    workflow_id = await start_task(
        tasks, ("pay", "charge_payment", VISA_CHARGE), ("refund", "refund_payment", REFUND_BY_STEP)
    )
    await wait_for(tasks, workflow_id, parked)
    by_hand = await payment_provider.create_payment_intent(
        ChargeRequest(
            amount=4200,
            currency="eur",
            customer="cus_alice",
            payment_method="pm_card_visa",
            description="charged by hand",
        ),
        idempotency_key="dashboard-1",
    )

    with pytest.raises(DecisionRefused, match="not this step's charge"):
        await tasks.reconcile(workflow_id, decide(ReconcileDecision.HAPPENED, by_hand.id))
    await tasks.reconcile(
        workflow_id, decide(ReconcileDecision.HAPPENED, by_hand.id, unverified=True)
    )

    result = await tasks.result(workflow_id)
    assert result.state is TaskState.SUCCEEDED, result.failure_reason
    charge, refund = await control.ledger()
    assert (charge.object_id, refund.kind, refund.amount) == (by_hand.id, "refund", 1500)
    assert refund.payment_intent == by_hand.id
    [decision] = [d for d in result.decisions if d.accepted]
    assert decision.verified is False


async def test_did_not_happen_on_an_existing_charge_is_refused_with_its_id_and_posts_nothing(
    dev_server: WorkflowEnvironment, worker: Worker, tasks: TaskClient, control: ProviderControl
) -> None:
    workflow_id = await park_a_charge_that_happened(control, tasks)
    [charge] = await control.ledger()
    posts_before = len(posts(await control.requests()))
    # Search still lags an hour: the consistent list is what finds the charge.

    with pytest.raises(DecisionRefused) as refused:
        await tasks.reconcile(workflow_id, decide(ReconcileDecision.DID_NOT_HAPPEN))

    assert charge.object_id in str(refused.value) and "4200" in str(refused.value)
    # The same decision from the UI (a signal) is recorded as rejected, with the finding.
    handle = dev_server.client.get_workflow_handle(workflow_id)
    await handle.signal("reconcile", decide(ReconcileDecision.DID_NOT_HAPPEN))
    status = await wait_for(tasks, workflow_id, lambda status: bool(status.decisions))
    [rejected] = status.decisions
    assert not rejected.accepted and charge.object_id in (rejected.rejection or "")
    assert status.step("pay").state is StepState.PARKED
    assert len(posts(await control.requests())) == posts_before
    assert len(await control.ledger()) == 1

    await tasks.reconcile(workflow_id, decide(ReconcileDecision.HAPPENED, charge.object_id))
    assert (await tasks.result(workflow_id)).state is TaskState.SUCCEEDED
    assert len(posts(await control.requests())) == posts_before
    assert len(await control.ledger()) == 1


ONE_UNKNOWN_PARKS = FAST_BUDGET.model_copy(update={"max_attempts_per_step": 1})
"""A budget that parks a step after its first unknown outcome."""


def generation_key(workflow_id: str, generation: int) -> str:
    return derive_child_key(
        tenant=TENANT,
        workflow_id=workflow_id,
        step_id="pay",
        child_op="charge",
        provider_account=ACCOUNT,
        generation=generation,
    )


async def test_did_not_happen_on_a_key_holding_a_stored_500_sends_once_under_a_new_generation(
    worker: Worker, tasks: TaskClient, control: ProviderControl, database: str
) -> None:
    # Stripe answered 500 before charging and stores that 500 under the key: the old key
    # can never make progress again.
    await control.add_fault(Fault.ERROR_500_BEFORE_COMMIT, path_prefix="/v1/payment_intents")
    workflow_id = await start_task(
        tasks, ("pay", "charge_payment", VISA_CHARGE), ("refund", "refund_payment", REFUND_BY_STEP)
    )
    status = await wait_for(tasks, workflow_id, parked)
    assert "stored this failure" in (status.step("pay").park_reason or "")
    assert await control.ledger() == []

    answer = await tasks.reconcile(workflow_id, decide(ReconcileDecision.DID_NOT_HAPPEN))

    assert "under a new key (generation 2" in answer.message
    result = await tasks.result(workflow_id)
    assert result.state is TaskState.SUCCEEDED, result.failure_reason
    first, second = generation_key(workflow_id, 1), generation_key(workflow_id, 2)
    # Under the old key a POST and its repeat (the 500 replayed: stored), one under the
    # new: one charge.
    assert [(r.idempotency_key, r.outcome) for r in posts(await control.requests())] == [
        (first, "faulted"),
        (first, "replayed"),
        (second, "executed"),
    ]
    charge, refund = await control.ledger()
    assert (charge.kind, charge.amount, refund.kind, refund.amount) == (
        "charge",
        4200,
        "refund",
        1500,
    )
    # The refund named the charge by its step and found it under the new generation.
    assert refund.payment_intent == charge.object_id
    step = result.step("pay")
    assert step.key_generation == 2 and step.evidence["key_generation"] == "2"
    last = step.attempts[-1]
    assert last.operator_authorised and last.key_generation == 2
    assert [attempt.key_generation for attempt in step.attempts] == [1, 1, 2]
    assert operation_row(database, second)[:2] == ("succeeded", charge.object_id)  # type: ignore[index]
    # The old generation's record stays as it was: never marked succeeded.
    assert operation_row(database, first)[:2] == ("started", None)  # type: ignore[index]


async def test_did_not_happen_past_the_keys_send_by_deadline_sends_under_a_new_generation(
    worker: Worker, tasks: TaskClient, control: ProviderControl
) -> None:
    # The connection resets before Stripe commits: unknown, nothing charged; the step
    # parks at once. The key's send-by deadline (0.4 s after its first send) passes while
    # it waits for the operator.
    await control.add_fault(Fault.RESET_BEFORE_COMMIT, path_prefix="/v1/payment_intents")
    workflow_id = await start_task(
        tasks, ("pay", SHORT_RETENTION_CHARGE.name, VISA_CHARGE), budget=ONE_UNKNOWN_PARKS
    )
    await wait_for(tasks, workflow_id, parked)
    await key_window_closed(worker.client, workflow_id)  # the operator decides after it

    answer = await tasks.reconcile(workflow_id, decide(ReconcileDecision.DID_NOT_HAPPEN))

    assert "under a new key (generation 2" in answer.message
    result = await tasks.result(workflow_id)
    assert result.state is TaskState.SUCCEEDED, result.failure_reason
    keys = [r.idempotency_key for r in posts(await control.requests())]
    assert keys == [generation_key(workflow_id, 1), generation_key(workflow_id, 2)]
    [charge] = await control.ledger()
    assert result.step("pay").resource_id == charge.object_id


async def test_did_not_happen_past_send_by_waits_for_the_old_keys_held_request_to_settle(
    worker: Worker, tasks: TaskClient, control: ProviderControl
) -> None:
    # Stripe holds the request 2 s before charging; the client gives up after 1 s, so
    # the step parks past its key's send-by with the charge not yet made. The operator
    # looks at once, finds nothing and decides did_not_happen: a new key sent now would
    # charge a second time when the held request commits.
    await control.add_fault(
        Fault.DELAY_BEFORE_COMMIT, path_prefix="/v1/payment_intents", delay_seconds=2.0
    )
    workflow_id = await start_task(
        tasks, ("pay", SHORT_RETENTION_CHARGE.name, VISA_CHARGE), budget=ONE_UNKNOWN_PARKS
    )
    await wait_for(tasks, workflow_id, parked)
    assert await control.ledger() == []

    answer = await tasks.reconcile(workflow_id, decide(ReconcileDecision.DID_NOT_HAPPEN))

    assert "once no request under the old key can still take effect" in answer.message
    result = await tasks.result(workflow_id)
    assert result.state is TaskState.SUCCEEDED, result.failure_reason
    # The held request charged; the look-up after the settle time found it: one charge,
    # and nothing was ever sent under a second key.
    [charge] = await control.ledger()
    assert [r.idempotency_key for r in posts(await control.requests())] == [
        generation_key(workflow_id, 1)
    ]
    step = result.step("pay")
    assert step.resource_id == charge.object_id
    assert step.key_generation == 1 and step.evidence["found_after_decision"] == "true"


async def test_did_not_happen_inside_the_keys_window_repeats_the_same_key(
    worker: Worker, tasks: TaskClient, control: ProviderControl
) -> None:
    # The same reset, but the provider keeps keys for a day: a repeat under the old key
    # is safe (Stripe would answer it from its record if the first had charged).
    await control.add_fault(Fault.RESET_BEFORE_COMMIT, path_prefix="/v1/payment_intents")
    workflow_id = await start_task(
        tasks, ("pay", "charge_payment", VISA_CHARGE), budget=ONE_UNKNOWN_PARKS
    )
    await wait_for(tasks, workflow_id, parked)

    answer = await tasks.reconcile(workflow_id, decide(ReconcileDecision.DID_NOT_HAPPEN))

    assert "new key" not in answer.message
    result = await tasks.result(workflow_id)
    assert result.state is TaskState.SUCCEEDED, result.failure_reason
    assert [r.idempotency_key for r in posts(await control.requests())] == [
        generation_key(workflow_id, 1)
    ] * 2
    assert len(await control.ledger()) == 1
    assert result.step("pay").key_generation == 1


async def test_did_not_happen_on_a_lagging_search_miss_is_refused_and_no_second_charge_is_made(
    worker: Worker, tasks: TaskClient, control: ProviderControl
) -> None:
    # The list API stays unreadable: the look-up falls back to search, which lags an
    # hour, so its miss proves nothing about the charge that exists.
    workflow_id = await park_a_charge_that_happened(control, tasks)
    # The first matching rule applies: search answers (after no delay), the rest 503.
    await control.add_fault(
        Fault.DELAY_BEFORE_COMMIT,
        method="GET",
        path_prefix="/v1/payment_intents/search",
        times=None,
    )
    await control.add_fault(
        Fault.ERROR_503, method="GET", path_prefix="/v1/payment_intents", times=None
    )
    posts_before = len(posts(await control.requests()))

    with pytest.raises(DecisionRefused, match="could not show that step pay's effect does not"):
        await tasks.reconcile(workflow_id, decide(ReconcileDecision.DID_NOT_HAPPEN))

    assert len(posts(await control.requests())) == posts_before
    [charge] = await control.ledger()
    status = await tasks.status(workflow_id)
    assert status.step("pay").state is StepState.PARKED
    assert "eventually consistent" in status.step("pay").evidence["lookup_search"]
    await control.clear_faults()
    await tasks.reconcile(workflow_id, decide(ReconcileDecision.HAPPENED, charge.object_id))
    assert (await tasks.result(workflow_id)).state is TaskState.SUCCEEDED
    assert len(await control.ledger()) == 1
