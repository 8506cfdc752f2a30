"""``refund_payment`` end to end, after a charge in the same task, with and without approval."""

import pytest
from onceflow_devstack.stripe_provider import Fault, ProviderControl
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.payments import RefundPaymentInput
from onceflow.task_api import TaskClient
from onceflow.tools.worker import derive_child_key
from onceflow.workflows.task_models import ApproveInput, StepState, TaskState
from tests.harness import workflow_idle

from .conftest import (
    ACCOUNT,
    REFUND_PAYMENT,
    TENANT,
    VISA_CHARGE,
    operation_row,
    start_task,
    wait_for,
)

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]

THRESHOLD = int(REFUND_PAYMENT.contract.approval_threshold.above)  # type: ignore[union-attr]
BIG_CHARGE = {**VISA_CHARGE, "amount": THRESHOLD * 3}


def key(workflow_id: str, step_id: str, child_op: str) -> str:
    return derive_child_key(
        tenant=TENANT,
        workflow_id=workflow_id,
        step_id=step_id,
        child_op=child_op,
        provider_account=ACCOUNT,
    )


async def test_charge_then_refund_in_one_task_makes_one_of_each_with_its_own_key(
    worker: Worker, tasks: TaskClient, control: ProviderControl, database: str
) -> None:
    # The refund's first answer is lost too: its retry must replay, not refund twice.
    await control.add_fault(Fault.DROP_AFTER_COMMIT, path_prefix="/v1/refunds")
    workflow_id = await start_task(
        tasks,
        ("charge", "charge_payment", VISA_CHARGE),
        (
            "refund",
            "refund_payment",
            {"charge_step": "charge", "amount": 1500, "reason": "requested_by_customer"},
        ),
    )
    result = await tasks.result(workflow_id)

    charge, refund = await control.ledger()
    charge_key = key(workflow_id, "charge", "charge")
    refund_key = key(workflow_id, "refund", "refund")
    assert result.state is TaskState.SUCCEEDED
    assert (charge.kind, charge.amount, charge.idempotency_key) == ("charge", 4200, charge_key)
    assert (refund.kind, refund.amount, refund.idempotency_key) == ("refund", 1500, refund_key)
    assert charge_key != refund_key
    assert refund.payment_intent == charge.object_id
    assert result.step("refund").resource_id == refund.object_id
    assert result.step("refund").result["payment_intent"] == charge.object_id
    refund_posts = [r for r in await control.requests() if r.path == "/v1/refunds"]
    assert [(r.idempotency_key, r.outcome) for r in refund_posts] == [
        (refund_key, "executed"),
        (refund_key, "replayed"),
    ]
    assert operation_row(database, charge_key)[:2] == ("succeeded", charge.object_id)
    assert operation_row(database, refund_key)[:3] == (
        "succeeded",
        refund.object_id,
        refund.request_id,
    )


@pytest.mark.parametrize("approved", [True, False], ids=["approved", "denied"])
async def test_a_refund_above_the_threshold_waits_for_approval(
    dev_server: WorkflowEnvironment,
    worker: Worker,
    tasks: TaskClient,
    control: ProviderControl,
    approved: bool,
) -> None:
    big_refund = {"charge_step": "charge", "amount": THRESHOLD + 1}
    workflow_id = await start_task(
        tasks,
        ("charge", "charge_payment", BIG_CHARGE),
        ("refund", "refund_payment", big_refund),
    )
    waiting = await wait_for(
        tasks, workflow_id, lambda status: status.state is TaskState.AWAITING_APPROVAL
    )
    await workflow_idle(dev_server.client, workflow_id)  # no refund attempt in flight or due

    def refund_requests(log: list) -> list:  # type: ignore[type-arg]
        return [r for r in log if r.path.startswith("/v1/refunds")]

    assert [entry.kind for entry in await control.ledger()] == ["charge"]
    assert refund_requests(await control.requests()) == []
    assert waiting.step("refund").attempts == []

    await tasks.approve(
        workflow_id,
        ApproveInput(
            step_id="refund",
            approved=approved,
            approver="cfo@acme",
            reason="checked with the customer" if approved else "looks like fraud",
            arguments_digest=waiting.step("refund").arguments_digest,
        ),
    )
    result = await tasks.result(workflow_id)
    await workflow_idle(dev_server.client, workflow_id)  # every attempt has reported back

    ledger = await control.ledger()
    if approved:
        assert result.state is TaskState.SUCCEEDED
        assert [(entry.kind, entry.amount) for entry in ledger] == [
            ("charge", THRESHOLD * 3),
            ("refund", THRESHOLD + 1),
        ]
    else:
        assert result.state is TaskState.FAILED
        assert result.step("refund").state is StepState.DENIED
        assert [entry.kind for entry in ledger] == ["charge"]
        assert refund_requests(await control.requests()) == []


async def test_a_refund_below_the_threshold_needs_no_approval_and_a_full_refund_always_does(
    dev_server: WorkflowEnvironment, worker: Worker, tasks: TaskClient, control: ProviderControl
) -> None:
    assert not REFUND_PAYMENT.contract.needs_approval(
        RefundPaymentInput(payment_intent="pi_1", amount=THRESHOLD)
    )
    assert REFUND_PAYMENT.contract.needs_approval(RefundPaymentInput(payment_intent="pi_1"))
    workflow_id = await start_task(
        tasks,
        ("charge", "charge_payment", VISA_CHARGE),
        ("refund", "refund_payment", {"charge_step": "charge"}),
    )
    await wait_for(tasks, workflow_id, lambda status: status.state is TaskState.AWAITING_APPROVAL)
    assert [entry.kind for entry in await control.ledger()] == ["charge"]
    await dev_server.client.get_workflow_handle(workflow_id).terminate("test over")


async def test_a_refund_naming_a_step_that_charged_nothing_is_rejected_without_a_call(
    worker: Worker, tasks: TaskClient, control: ProviderControl
) -> None:
    workflow_id = await start_task(
        tasks, ("refund", "refund_payment", {"charge_step": "nope", "amount": 100})
    )
    result = await tasks.result(workflow_id)

    assert result.state is TaskState.FAILED
    assert "no recorded PaymentIntent" in (result.step("refund").attempts[0].reason or "")
    assert await control.requests() == []


def test_refund_arguments_name_exactly_one_charge() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        RefundPaymentInput(payment_intent="pi_1", charge_step="charge")
    with pytest.raises(ValueError, match="exactly one"):
        RefundPaymentInput(amount=5)
    assert REFUND_PAYMENT.contract.mcp_annotations()["destructiveHint"] is True
