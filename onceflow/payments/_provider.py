"""The payment operations onceflow uses, as a small protocol other providers can implement.

Values in and out are plain frozen dataclasses, so activities never touch a provider
SDK's objects; every failure is a ``PaymentProviderError`` carrying its outcome class.
"""

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

OPERATION_METADATA_KEY = "onceflow_operation"
"""Metadata key holding the operation id (the child key's digest, never a raw key)."""
LIST_LIMIT = 1000
"""Most objects one list look-up reads (ten pages of 100): past it, it proves nothing."""


@dataclass(frozen=True, kw_only=True)
class ProviderReply:
    """Correlation ids of one provider answer."""

    request_id: str | None
    """The provider's id of this request (Stripe's ``Request-Id``)."""
    replayed: bool = False
    """The answer was stored under the idempotency key and replayed."""
    original_request_id: str | None = None
    """With ``replayed``: the request that produced the stored answer."""

    @property
    def committing_request_id(self) -> str | None:
        """The request that produced the effect: the original one for a replay."""
        return self.original_request_id if self.replayed else self.request_id


@dataclass(frozen=True, kw_only=True)
class ChargeRequest:
    """Create and confirm one PaymentIntent (one charge) in one call."""

    amount: int
    """Amount in the currency's smallest unit."""
    currency: str
    customer: str
    payment_method: str
    description: str
    metadata: dict[str, str] = field(default_factory=dict)
    """Must hold ``OPERATION_METADATA_KEY`` so a lookup can find the effect."""


@dataclass(frozen=True, kw_only=True)
class RefundRequest:
    """Refund (part of) a PaymentIntent's charge."""

    payment_intent: str
    amount: int | None = None
    """None refunds what is left of the charge."""
    reason: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class PaymentIntentView:
    """What onceflow reads from a PaymentIntent."""

    id: str
    status: str
    amount: int
    currency: str
    latest_charge: str | None
    metadata: dict[str, str]
    amount_refunded: int | None = None
    """From the expanded latest charge, when the call asked for it."""
    created: int = 0
    """When the provider created it (Unix seconds, its own clock)."""
    reply: ProviderReply


@dataclass(frozen=True, kw_only=True)
class RefundView:
    """What onceflow reads from a Refund."""

    id: str
    status: str
    amount: int
    currency: str
    payment_intent: str | None
    metadata: dict[str, str]
    created: int = 0
    """When the provider created it (Unix seconds, its own clock)."""
    reply: ProviderReply


class PaymentProvider(Protocol):
    """The payment operations onceflow performs.

    Implementations make exactly one request per call, or per page of a list (no retries
    of their own: the workflow's budget is the only retry owner), send the given
    idempotency key on every POST, and raise ``PaymentProviderError`` for every failure.
    """

    @property
    def account(self) -> str:
        """The provider account effects land in; part of every derived child key."""
        ...

    @property
    def request_timeout(self) -> timedelta:
        """The longest one call may take before it gives up (connect plus answer)."""
        ...

    async def create_payment_intent(
        self, request: ChargeRequest, *, idempotency_key: str
    ) -> PaymentIntentView:
        """Create and confirm a PaymentIntent under ``idempotency_key``."""
        ...

    async def retrieve_payment_intent(
        self, payment_intent_id: str, *, with_charge: bool = False
    ) -> PaymentIntentView:
        """Read a PaymentIntent by id (strongly consistent).

        Args:
            payment_intent_id: The PaymentIntent.
            with_charge: Also read the latest charge's refunded amount.
        """
        ...

    async def list_payment_intents(
        self, *, customer: str, created_from: datetime | None = None
    ) -> list[PaymentIntentView]:
        """``customer``'s PaymentIntents created at or after ``created_from``, newest
        first (strongly consistent: the list API, one request per page).

        Raises:
            PaymentProviderError: A page could not be read, or there are more than
                ``LIST_LIMIT`` (the look-up then proves nothing).
        """
        ...

    async def search_payment_intents(self, operation_id: str) -> list[PaymentIntentView]:
        """PaymentIntents whose metadata names ``operation_id`` (eventually consistent)."""
        ...

    async def create_refund(self, request: RefundRequest, *, idempotency_key: str) -> RefundView:
        """Create a refund under ``idempotency_key``."""
        ...

    async def retrieve_refund(self, refund_id: str) -> RefundView:
        """Read a refund by id (strongly consistent)."""
        ...

    async def list_refunds(self, payment_intent: str) -> list[RefundView]:
        """Every refund of ``payment_intent``, newest first (strongly consistent: the
        list API, one request per page); raises like ``list_payment_intents``."""
        ...
