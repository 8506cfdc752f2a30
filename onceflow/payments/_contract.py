"""What ``charge_payment`` and ``refund_payment`` do to the world: Stripe dedupes their
derived keys, but only for as long as it remembers them.

Each step sends one POST whose ``Idempotency-Key`` is derived from the step's full
identity, so repeating the step repeats the same key and Stripe replays the first answer.
Stripe forgets a key after about 24 hours; after that a repeat would be a new charge, so
the contracts carry the provider's key retention and a safety margin, and the workflow
repeats only while the first attempt is younger than ``retention - margin``; past that
it runs the lookup and parks if the lookup is inconclusive.
"""

from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from onceflow.payments._settings import PaymentToolSettings
from onceflow.tools import (
    ApprovalThreshold,
    DedupeStrategy,
    EffectFlags,
    IntentIdentity,
    Provider,
    ToolContract,
)

STRIPE = Provider(name="stripe", requests_per_second=100)
"""Stripe, which both payment tools reach: one retry budget and pause switch for both.
Its documented live-mode rate limit is 100 read and write requests per second."""

_IDENTIFIER = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
_STRIPE_ID = r"^[a-z]{2,6}_[A-Za-z0-9_]{1,200}$"
_LARGEST_AMOUNT = 99_999_999
"""Stripe accepts at most eight digits in the smallest currency unit."""


class ChargePaymentInput(BaseModel):
    """Charge a customer's payment method once for an order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    amount: int = Field(strict=True, gt=0, le=_LARGEST_AMOUNT)
    """Amount in the currency's smallest unit (cents for EUR and USD)."""
    currency: str = Field(pattern=r"^[a-z]{3}$")
    """Three-letter ISO currency code, lower case."""
    customer: str = Field(pattern=_STRIPE_ID)
    """The Stripe customer (``cus_…``)."""
    payment_method: str = Field(pattern=_STRIPE_ID)
    """The customer's saved payment method (``pm_…``)."""
    order_id: str = Field(pattern=_IDENTIFIER)
    """The order being paid; shown in Stripe as the charge's description and metadata."""


class RefundPaymentInput(BaseModel):
    """Refund (part of) a charge: name the PaymentIntent, or a charge step of this task."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    payment_intent: str | None = Field(default=None, pattern=r"^pi_[A-Za-z0-9_]{1,200}$")
    """The PaymentIntent whose charge is refunded."""
    charge_step: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
    """Instead of ``payment_intent``: the id of an earlier ``charge_payment`` step of the
    same task, whose PaymentIntent onceflow recorded when that step succeeded."""
    amount: int | None = Field(default=None, strict=True, gt=0, le=_LARGEST_AMOUNT)
    """Minor units to refund; None refunds what is left (and always needs approval)."""
    reason: Literal["duplicate", "fraudulent", "requested_by_customer"] | None = None

    @model_validator(mode="after")
    def _names_one_charge(self) -> "RefundPaymentInput":
        if (self.payment_intent is None) == (self.charge_step is None):
            raise ValueError("give exactly one of payment_intent and charge_step")
        return self


def charge_payment_contract(
    settings: PaymentToolSettings, *, name: str = "charge_payment"
) -> ToolContract:
    """The ``charge_payment`` contract under ``settings`` (``name`` for test variants)."""
    return ToolContract(
        name=name,
        description=(
            "Charge a customer's saved payment method for an order; the same call in the "
            "same task charges at most once."
        ),
        input_model=ChargePaymentInput,
        # Idempotent per step: the same call (same task, same step) always carries the
        # same derived key, Stripe replays the first answer for it, and once Stripe may
        # have forgotten the key onceflow looks up or parks instead of posting again.
        # A call under a *new* idempotency key is a new task and a new charge.
        # Not destructive: a charge adds money movement, it destroys nothing.
        effects=EffectFlags(idempotent=True, destructive=False, open_world=True),
        dedupe=DedupeStrategy.PROVIDER_IDEMPOTENCY_KEY,
        # One charge per order, amount and currency in a tenant, whatever key, task or
        # surface asks for it (a new order id is a new charge).
        intent=IntentIdentity(arguments=("order_id", "amount", "currency")),
        start_to_close_timeout=settings.attempt_timeout,
        provider_key_retention=settings.key_retention,
        retention_margin=settings.retention_margin,
        provider_settle_time=settings.settle_time,
        # An operator's "happened --resource-id" is retrieved and checked against the
        # step (operation id, amount, currency) before it is accepted.
        lookup_verifies_resource_ids=True,
        provider=STRIPE,
    )


def refund_payment_contract(
    settings: PaymentToolSettings, *, name: str = "refund_payment"
) -> ToolContract:
    """The ``refund_payment`` contract under ``settings`` (``name`` for test variants)."""
    return ToolContract(
        name=name,
        description=(
            "Refund a charge, in full or in part; large refunds wait for a person's approval."
        ),
        input_model=RefundPaymentInput,
        # Idempotent per step for the same reason as charge_payment; destructive because
        # it undoes a payment. Approval is a separate question from idempotency.
        effects=EffectFlags(idempotent=True, destructive=True, open_world=True),
        dedupe=DedupeStrategy.PROVIDER_IDEMPOTENCY_KEY,
        # One refund of an amount of one charge; a refund of "this task's charge step"
        # names a charge inside its task, so only that task shares it.
        intent=IntentIdentity(
            arguments=("payment_intent", "charge_step", "amount"),
            task_relative=("charge_step",),
        ),
        start_to_close_timeout=settings.attempt_timeout,
        requires_approval=True,
        approval_threshold=ApprovalThreshold(
            argument="amount", above=Decimal(settings.refund_approval_above)
        ),
        provider_key_retention=settings.key_retention,
        retention_margin=settings.retention_margin,
        provider_settle_time=settings.settle_time,
        # An operator's "happened --resource-id" is retrieved and checked against the
        # step (operation id, amount, currency) before it is accepted.
        lookup_verifies_resource_ids=True,
        provider=STRIPE,
    )
