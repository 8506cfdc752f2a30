"""``charge_payment`` end to end: Temporal dev server, worker, PostgreSQL, the real Stripe
SDK over HTTP, and the local provider's ledger as the judge of how many charges exist."""

import asyncio
import os
from datetime import timedelta

import pytest
from onceflow_devstack.stripe_provider import Fault, ProviderControl, RequestRecord
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.payments import ChargeRequest, PaymentProviderError, StripePaymentProvider
from onceflow.retry_policy import OutcomeClass
from onceflow.task_api import TaskClient
from onceflow.tools.worker import derive_child_key, key_digest
from onceflow.workflows.task_models import ReconcileDecision, ReconcileInput, StepState, TaskState
from tests.harness import REPO, onceflow_command, workflow_idle

from .conftest import (
    ACCOUNT,
    CHARGE_PAYMENT,
    FAST_BUDGET,
    SHORT_RETENTION_CHARGE,
    TENANT,
    VISA_CHARGE,
    operation_row,
    start_task,
    wait_for,
)

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]


def charge_key(workflow_id: str, step_id: str = "pay") -> str:
    return derive_child_key(
        tenant=TENANT,
        workflow_id=workflow_id,
        step_id=step_id,
        child_op="charge",
        provider_account=ACCOUNT,
    )


def posts(log: list[RequestRecord], path: str = "/v1/payment_intents") -> list[RequestRecord]:
    return [record for record in log if record.method == "POST" and record.path == path]


def parked(status: object) -> bool:
    return getattr(status, "state", None) is TaskState.PARKED


async def test_a_lost_response_is_retried_with_the_same_key_and_charges_once(
    worker: Worker, tasks: TaskClient, control: ProviderControl, database: str
) -> None:
    await control.add_fault(Fault.DROP_AFTER_COMMIT, path_prefix="/v1/payment_intents")
    workflow_id = await start_task(tasks, ("pay", "charge_payment", VISA_CHARGE))
    result = await tasks.result(workflow_id)

    [entry] = await control.ledger()
    key = charge_key(workflow_id)
    step = result.step("pay")
    assert result.state is TaskState.SUCCEEDED
    assert (entry.kind, entry.amount, entry.currency) == ("charge", 4200, "eur")
    assert step.resource_id == entry.object_id
    assert [attempt.outcome for attempt in step.attempts] == [
        OutcomeClass.UNKNOWN,
        OutcomeClass.SUCCEEDED,
    ]
    # The retry carried the same derived key, and the provider replayed the first charge.
    assert [(r.idempotency_key, r.outcome) for r in posts(await control.requests())] == [
        (key, "executed"),
        (key, "replayed"),
    ]
    assert entry.idempotency_key == key
    assert entry.metadata["onceflow_operation"] == key_digest(key)
    assert entry.metadata["order_id"] == "ord-1001"
    assert not any(value.startswith("client-key-") for value in entry.metadata.values())
    assert step.result["replayed"] is True
    assert step.result["request_id"] == entry.request_id
    # Resource and request ids were persisted before the step was reported done.
    assert operation_row(database, key)[:3] == ("succeeded", entry.object_id, entry.request_id)


async def test_a_stored_500_is_repeated_once_then_the_list_look_up_finds_the_charge(
    worker: Worker, tasks: TaskClient, control: ProviderControl
) -> None:
    # Charged, answered 500 and stored under the key; search lags an hour.
    await control.configure(search_lag_seconds=3600)
    await control.add_fault(Fault.ERROR_500_AFTER_COMMIT, path_prefix="/v1/payment_intents")
    workflow_id = await start_task(tasks, ("pay", "charge_payment", VISA_CHARGE))
    result = await tasks.result(workflow_id)

    [entry] = await control.ledger()
    assert result.state is TaskState.SUCCEEDED
    assert result.step("pay").resource_id == entry.object_id
    assert result.step("pay").result["found_by"] == "lookup:list"
    # A fresh 500 may not be stored: one same-key repeat shows it was (replayed), and
    # the consistent list finds the charge the lagging search would have missed.
    assert [r.outcome for r in posts(await control.requests())] == ["executed", "replayed"]


@pytest.mark.parametrize("path", ["/v1/payment_intents", "/v1/refunds"])
async def test_a_500_before_the_endpoint_executed_is_repeated_under_its_key_and_succeeds(
    worker: Worker, tasks: TaskClient, control: ProviderControl, path: str
) -> None:
    # Stripe stores nothing when the endpoint never began executing: a same-key repeat
    # runs afresh. No person is needed.
    await control.add_fault(Fault.ERROR_500_BEFORE_EXECUTING, path_prefix=path)
    workflow_id = await start_task(
        tasks,
        ("pay", "charge_payment", VISA_CHARGE),
        ("refund", "refund_payment", {"charge_step": "pay", "amount": 1500}),
    )
    result = await tasks.result(workflow_id)

    assert result.state is TaskState.SUCCEEDED, result.failure_reason
    assert result.decisions == []
    faulted = posts(await control.requests(), path)
    assert [r.outcome for r in faulted] == ["faulted", "executed"]
    assert faulted[0].idempotency_key == faulted[1].idempotency_key
    charge, refund = await control.ledger()
    assert (charge.kind, refund.kind, refund.amount) == ("charge", "refund", 1500)
    assert refund.payment_intent == charge.object_id


async def test_a_refunds_stored_500_is_resolved_by_listing_the_payment_intents_refunds(
    worker: Worker, tasks: TaskClient, control: ProviderControl
) -> None:
    await control.add_fault(Fault.ERROR_500_AFTER_COMMIT, path_prefix="/v1/refunds")
    workflow_id = await start_task(
        tasks,
        ("pay", "charge_payment", VISA_CHARGE),
        ("refund", "refund_payment", {"charge_step": "pay", "amount": 1500}),
    )
    result = await tasks.result(workflow_id)

    assert result.state is TaskState.SUCCEEDED, result.failure_reason
    charge, refund = await control.ledger()
    assert result.step("refund").resource_id == refund.object_id
    assert result.step("refund").result["found_by"] == "lookup:list"
    assert [r.outcome for r in posts(await control.requests(), "/v1/refunds")] == [
        "executed",
        "replayed",
    ]
    assert refund.payment_intent == charge.object_id


async def test_a_provider_that_always_times_out_past_key_retention_parks_without_a_second_post(
    dev_server: WorkflowEnvironment,
    worker: Worker,
    tasks: TaskClient,
    control: ProviderControl,
    task_queue: str,
) -> None:
    # The provider forgets keys after 0.5 s; every answer (the search's too) comes 3 s
    # after the commit, long after the worker's 1 s client timeout.
    await control.configure(key_retention_seconds=0.5)
    await control.add_fault(
        Fault.DELAY_AFTER_COMMIT,
        method=None,
        path_prefix="/v1/payment_intents",
        times=None,
        delay_seconds=3,
    )
    workflow_id = await start_task(tasks, ("pay", SHORT_RETENTION_CHARGE.name, VISA_CHARGE))
    status = await wait_for(tasks, workflow_id, parked)

    step = status.step("pay")
    [attempt] = step.attempts
    assert attempt.outcome is OutcomeClass.UNKNOWN
    retention = SHORT_RETENTION_CHARGE.contract.provider_key_retention
    assert retention is not None
    assert attempt.finished_at - attempt.started_at > retention
    # The key's window timer fired before the attempt's end reached the workflow.
    assert "send window of the step's key closed" in (step.park_reason or "")
    assert step.evidence["child_key_digest"] == key_digest(charge_key(workflow_id))
    assert "search failed" in step.evidence["lookup_search"]
    assert "sent_at" in step.evidence and "lookup_at" in step.evidence
    [entry] = await control.ledger()
    assert len(posts(await control.requests())) == 1

    # The operator finds the charge at the provider and runs the printed command, once
    # the provider answers again: the task retrieves the named PaymentIntent to check it.
    await control.clear_faults()
    assert step.reconcile_command is not None
    assert step.reconcile_command.startswith(f"onceflow reconcile {workflow_id} --step pay")
    process = await asyncio.create_subprocess_exec(
        *onceflow_command(
            "reconcile",
            workflow_id,
            "--step",
            "pay",
            "--decision",
            "happened",
            "--resource-id",
            entry.object_id,
            "--reason",
            "found in the Stripe dashboard",
        ),
        cwd=REPO,
        env={
            **os.environ,
            "TEMPORAL_ADDRESS": dev_server.client.service_client.config.target_host,
            "ONCEFLOW_TASK_QUEUE": task_queue,
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    assert f"succeeds with resource {entry.object_id}" in out.decode()

    result = await tasks.result(workflow_id)
    assert result.state is TaskState.SUCCEEDED
    assert result.step("pay").resource_id == entry.object_id
    assert len(await control.ledger()) == 1
    assert len(posts(await control.requests())) == 1


async def test_a_stored_500_is_repeated_once_then_looked_up_and_parked_with_its_reason(
    dev_server: WorkflowEnvironment, worker: Worker, tasks: TaskClient, control: ProviderControl
) -> None:
    # Stripe's endpoint broke midway before charging, answered 500 and stores that 500
    # under the key.
    await control.add_fault(Fault.ERROR_500_BEFORE_COMMIT, path_prefix="/v1/payment_intents")
    workflow_id = await start_task(tasks, ("pay", "charge_payment", VISA_CHARGE))
    status = await wait_for(tasks, workflow_id, parked)

    step = status.step("pay")
    key = charge_key(workflow_id)
    # A fresh 500 may not have been stored: one same-key repeat shows it was (replayed);
    # then no more budget is spent on a key that can only replay it.
    assert [attempt.outcome for attempt in step.attempts] == [OutcomeClass.UNKNOWN] * 2
    assert [(r.idempotency_key, r.outcome) for r in posts(await control.requests())] == [
        (key, "faulted"),
        (key, "replayed"),
    ]
    reason = step.park_reason or ""
    assert "stored this failure under the step's key" in reason
    assert "until it forgets the key at about" in reason
    assert step.evidence["key_expires_at"]
    # Looked up by the consistent list (the attempt's own, then the workflow's): nothing.
    assert "the charge does not exist" in step.evidence["lookup_list"]
    assert "lookup_at" in step.evidence
    assert await control.ledger() == []

    # Parked means parked: nothing runs by itself.
    await workflow_idle(dev_server.client, workflow_id)  # no timer, no attempt in flight
    assert (await tasks.status(workflow_id)).state is TaskState.PARKED
    assert len(posts(await control.requests())) == 2

    # The list's miss proves the charge absent: did_not_happen is accepted, checked,
    # and the next key generation charges once.
    await tasks.reconcile(
        workflow_id,
        ReconcileInput(
            step_id="pay",
            decision=ReconcileDecision.DID_NOT_HAPPEN,
            operator="ops@acme",
            reason="nothing in the dashboard",
        ),
    )
    result = await tasks.result(workflow_id)
    assert result.state is TaskState.SUCCEEDED
    assert [d.verified for d in result.decisions] == [True]
    assert len(await control.ledger()) == 1


async def test_a_declined_card_is_tried_once_and_fails_the_task(
    worker: Worker, tasks: TaskClient, control: ProviderControl, database: str
) -> None:
    declined = {**VISA_CHARGE, "payment_method": "pm_card_chargeDeclined"}
    workflow_id = await start_task(tasks, ("pay", "charge_payment", declined))
    result = await tasks.result(workflow_id)

    step = result.step("pay")
    assert result.state is TaskState.FAILED
    assert step.state is StepState.FAILED
    assert [attempt.outcome for attempt in step.attempts] == [OutcomeClass.REJECTED]
    assert "card was declined: card_declined" in (step.attempts[0].reason or "")
    assert step.evidence["payment_intent"].startswith("pi_")
    assert await control.ledger() == []
    assert len(posts(await control.requests())) == 1
    assert operation_row(database, charge_key(workflow_id))[0] == "failed"


def test_the_stripe_client_never_retries_on_its_own(
    payment_provider: StripePaymentProvider,
) -> None:
    assert payment_provider.client._requestor._options.max_network_retries == 0


async def test_one_call_is_one_request_even_when_the_provider_answers_503(
    payment_provider: StripePaymentProvider, control: ProviderControl
) -> None:
    await control.add_fault(Fault.ERROR_503, times=None)
    with pytest.raises(PaymentProviderError) as failed:
        await payment_provider.create_payment_intent(
            ChargeRequest(
                amount=100,
                currency="eur",
                customer="cus_x",
                payment_method="pm_card_visa",
                description="order x",
            ),
            idempotency_key="one-call",
        )
    assert (failed.value.outcome, failed.value.http_status) == (OutcomeClass.UNKNOWN, 503)
    assert len(await control.requests()) == 1


async def test_a_provider_answering_503_gets_exactly_the_attempts_the_budget_allows(
    worker: Worker, tasks: TaskClient, control: ProviderControl
) -> None:
    await control.add_fault(Fault.ERROR_503, times=None)
    workflow_id = await start_task(tasks, ("pay", "charge_payment", VISA_CHARGE))
    status = await wait_for(tasks, workflow_id, parked)

    sent = posts(await control.requests())
    assert len(sent) == FAST_BUDGET.max_attempts_per_step
    assert {r.idempotency_key for r in sent} == {charge_key(workflow_id)}
    assert status.budget.attempts_used == FAST_BUDGET.max_attempts_per_step
    assert await control.ledger() == []

    await tasks.reconcile(
        workflow_id,
        ReconcileInput(
            step_id="pay",
            decision=ReconcileDecision.ABANDON,
            operator="ops@acme",
            reason="provider outage; the agent will try later",
        ),
    )
    assert (await tasks.result(workflow_id)).state is TaskState.FAILED
    assert len(posts(await control.requests())) == FAST_BUDGET.max_attempts_per_step


async def test_a_rate_limited_charge_waits_for_stripe_without_spending_attempts(
    worker: Worker, tasks: TaskClient, control: ProviderControl
) -> None:
    # More 429s than the step has attempts: "not now" spends none of them.
    rate_limited = FAST_BUDGET.max_attempts_per_step + 1
    await control.add_fault(Fault.RATE_LIMIT_429, times=rate_limited)
    workflow_id = await start_task(tasks, ("pay", "charge_payment", VISA_CHARGE))
    result = await tasks.result(workflow_id)

    assert result.state is TaskState.SUCCEEDED, result.failure_reason
    [step] = result.steps
    assert [a.throttled for a in step.attempts] == [True] * rate_limited + [False]
    assert result.budget.attempts_used == 1
    assert len(posts(await control.requests())) == rate_limited + 1
    assert len(await control.ledger()) == 1


def test_the_default_contract_repeats_only_inside_stripes_key_retention() -> None:
    contract = CHARGE_PAYMENT.registered_contract
    assert contract.provider_key_retention == timedelta(hours=24)
    assert contract.safe_repeat_window(timedelta(hours=22)) == timedelta(hours=1)
    assert contract.safe_repeat_window(timedelta(hours=23)) == timedelta(0)
    assert contract.lookup_activity == "look_up_charge_payment"
    assert contract.mcp_annotations()["idempotentHint"] is True
    assert contract.mcp_annotations()["openWorldHint"] is True
