"""The lookup activities in ``ActivityEnvironment``, against the local provider and PostgreSQL.

A lookup may only say ``succeeded`` when a read proves the effect exists. A miss in the
list API (read-after-write consistent) proves the effect absent; a miss in Stripe's
eventually consistent search proves nothing until its lag has passed.
"""

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from onceflow_devstack.stripe_provider import Fault, ProviderControl
from psycopg_pool import AsyncConnectionPool

from onceflow.payments import (
    ChargeRequest,
    PaymentIntentView,
    PaymentProvider,
    PaymentToolSettings,
    RefundRequest,
    StripePaymentProvider,
    payment_tools,
)
from onceflow.retry_policy import OutcomeClass
from onceflow.settings import InvalidSettings
from onceflow.tools.worker import ToolCallInput, derive_child_key, key_digest, tool_activities
from tests.harness import attempt_environment

from .conftest import (
    ACCOUNT,
    CHARGE_PAYMENT,
    REFUND_PAYMENT,
    TENANT,
    VISA_CHARGE,
    operation_row,
    policy_of,
    stripe_settings,
)

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]


@dataclass(frozen=True)
class PaymentActivities:
    """The payment tools' activities as a worker registers them, bound to one client."""

    charge_payment: Callable[..., Any]
    look_up_charge: Callable[..., Any]
    refund_payment: Callable[..., Any]
    look_up_refund: Callable[..., Any]

    @classmethod
    def of(cls, pool: AsyncConnectionPool, client: PaymentProvider | None) -> "PaymentActivities":
        charge, look_up_charge = tool_activities(CHARGE_PAYMENT, pool, client)
        refund, look_up_refund = tool_activities(REFUND_PAYMENT, pool, client)
        return cls(charge, look_up_charge, refund, look_up_refund)


@pytest.fixture
async def activities(
    payment_provider: StripePaymentProvider, pool: AsyncConnectionPool
) -> AsyncIterator[PaymentActivities]:
    yield PaymentActivities.of(pool, payment_provider)


def call(tool: str, arguments: dict[str, object], **evidence: str) -> ToolCallInput:
    return ToolCallInput(
        tenant=TENANT,
        principal="agent-7",
        workflow_id="task-lookups",
        step_id="pay",
        tool=tool,
        arguments=arguments,
        attempt=2,
        evidence=evidence,
        policy=policy_of(tool),
    )


async def charge_as_an_earlier_attempt(provider: StripePaymentProvider) -> PaymentIntentView:
    """The charge a lost attempt of step ``pay`` made: its key, its metadata."""
    child_key = derive_child_key(
        tenant=TENANT,
        workflow_id="task-lookups",
        step_id="pay",
        child_op="charge",
        provider_account=ACCOUNT,
    )
    return await provider.create_payment_intent(
        ChargeRequest(
            amount=4200,
            currency="eur",
            customer="cus_alice",
            payment_method="pm_card_visa",
            description="order ord-1001",
            metadata={"onceflow_operation": key_digest(child_key)},
        ),
        idempotency_key=child_key,
    )


async def test_the_list_finds_a_charge_whose_answer_was_lost_while_search_lags(
    activities: PaymentActivities,
    payment_provider: StripePaymentProvider,
    control: ProviderControl,
    database: str,
) -> None:
    await control.configure(search_lag_seconds=3600)
    intent = await charge_as_an_earlier_attempt(payment_provider)
    found = await attempt_environment().run(
        activities.look_up_charge, call("charge_payment", VISA_CHARGE)
    )
    assert found.outcome is OutcomeClass.SUCCEEDED
    assert found.resource_id == intent.id
    assert found.result["found_by"] == "lookup:list"
    # Found effects are recorded like answered ones, before they are reported.
    row = operation_row(
        database,
        derive_child_key(
            tenant=TENANT,
            workflow_id="task-lookups",
            step_id="pay",
            child_op="charge",
            provider_account=ACCOUNT,
        ),
    )
    assert row is not None and row[:2] == ("succeeded", intent.id)
    assert len(await control.ledger()) == 1


async def test_a_list_miss_proves_absence_a_search_miss_does_not_and_a_known_id_is_read(
    activities: PaymentActivities,
    payment_provider: StripePaymentProvider,
    control: ProviderControl,
) -> None:
    await control.configure(search_lag_seconds=3600)
    absent = await attempt_environment().run(
        activities.look_up_charge, call("charge_payment", VISA_CHARGE)
    )
    assert absent.outcome is OutcomeClass.UNKNOWN and absent.miss_proves_absence
    assert "the charge does not exist" in absent.evidence["lookup_list"]

    intent = await charge_as_an_earlier_attempt(payment_provider)
    # The list is unreadable: search answers (first matching rule), and lags.
    await control.add_fault(
        Fault.DELAY_BEFORE_COMMIT, method="GET", path_prefix="/v1/payment_intents/search"
    )
    await control.add_fault(Fault.ERROR_503, method="GET", path_prefix="/v1/payment_intents")
    missed = await attempt_environment().run(
        activities.look_up_charge, call("charge_payment", VISA_CHARGE)
    )
    assert missed.outcome is OutcomeClass.UNKNOWN and not missed.miss_proves_absence
    assert missed.miss_proves_absence_after == timedelta(hours=1)
    assert "could not be read" in missed.evidence["lookup_list"]
    assert "eventually consistent" in missed.evidence["lookup_search"]
    assert missed.evidence["child_key_digest"].startswith("sha256:")

    known = await attempt_environment().run(
        activities.look_up_charge, call("charge_payment", VISA_CHARGE, payment_intent=intent.id)
    )
    assert known.outcome is OutcomeClass.SUCCEEDED
    assert known.result["found_by"] == "lookup:retrieve"
    assert len(await control.ledger()) == 1


async def test_a_refund_is_found_among_its_payment_intents_refunds_and_a_miss_proves_absence(
    activities: PaymentActivities,
    payment_provider: StripePaymentProvider,
) -> None:
    intent = await charge_as_an_earlier_attempt(payment_provider)
    refund = call("refund_payment", {"payment_intent": intent.id, "amount": 100})
    looked = await attempt_environment().run(activities.look_up_refund, refund)
    assert looked.outcome is OutcomeClass.UNKNOWN and looked.miss_proves_absence
    assert looked.evidence["lookup_charge"] == f"{intent.id}: 0 of 4200 refunded"

    # Another refund of the same charge is not this step's; the step's own is found.
    await payment_provider.create_refund(
        RefundRequest(payment_intent=intent.id, amount=50), idempotency_key="by-hand"
    )
    refund_key = derive_child_key(
        tenant=TENANT,
        workflow_id="task-lookups",
        step_id="pay",
        child_op="refund",
        provider_account=ACCOUNT,
    )
    made = await payment_provider.create_refund(
        RefundRequest(
            payment_intent=intent.id,
            amount=100,
            metadata={"onceflow_operation": key_digest(refund_key)},
        ),
        idempotency_key=refund_key,
    )
    found = await attempt_environment().run(activities.look_up_refund, refund)
    assert found.outcome is OutcomeClass.SUCCEEDED and found.resource_id == made.id
    assert found.result["found_by"] == "lookup:list"


async def test_without_a_stripe_key_payment_tools_reject_with_a_clear_reason(
    pool: AsyncConnectionPool,
) -> None:
    unconfigured = PaymentActivities.of(pool, None)
    result = await attempt_environment().run(
        unconfigured.charge_payment, call("charge_payment", VISA_CHARGE)
    )
    assert result.outcome is OutcomeClass.REJECTED
    assert "STRIPE_API_KEY" in (result.reason or "")


def test_an_attempt_timeout_shorter_than_two_provider_calls_is_refused() -> None:
    slow = stripe_settings("http://127.0.0.1:9", request_timeout=timedelta(seconds=100))
    # InvalidSettings: the CLI prints it as one line and exits 2.
    with pytest.raises(InvalidSettings, match="ONCEFLOW_PAYMENTS_ATTEMPT_TIMEOUT"):
        payment_tools(PaymentToolSettings(), slow)
