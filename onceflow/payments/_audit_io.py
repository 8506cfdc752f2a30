"""The payments' ``Auditor``: reads the provider's PaymentIntents and refunds of a window
through the list API, and onceflow's records of them, then compares (``_audit``).

Reads, in order, each strongly consistent::

    GET /v1/payment_intents?created[gte]&created[lt]   every page (starting_after)
    GET /v1/refunds?created[gte]&created[lt]           every page
    operations created in the window (the audited tools)
    operations of the steps effects name whose operation id none of those has
    GET /v1/payment_intents/{id} | /v1/refunds/{id}    per succeeded record whose
                                                       resource the lists did not show

Stripe's search is never used: it is eventually consistent, so a miss there would
report a "missing" resource that exists.
"""

from collections.abc import AsyncIterator, Callable, Collection, Sequence
from datetime import UTC, datetime
from typing import Protocol

from psycopg_pool import AsyncConnectionPool

from onceflow.payments._audit import (
    AUDITED_TOOLS,
    FAMILY,
    PaymentsAuditInput,
    ProviderEffect,
    compare_payments,
    unlisted_resources,
    unowned_steps,
)
from onceflow.payments._errors import PaymentProviderError
from onceflow.payments._outcomes import CHARGE_CHILD_OP
from onceflow.payments._provider import PaymentIntentView, RefundView
from onceflow.tools import (
    AuditProgress,
    AuditReport,
    AuditWindow,
    ProviderUnreadable,
    read_operations,
    read_step_operations,
)


class AuditedPaymentProvider(Protocol):
    """What the payments' audit reads at a provider (``StripePaymentProvider`` has it)."""

    def payment_intent_pages(
        self, *, created_from: datetime, created_before: datetime
    ) -> AsyncIterator[list[PaymentIntentView]]:
        """PaymentIntents created in the window, a page at a time, newest first."""
        ...

    def refund_pages(
        self, *, created_from: datetime, created_before: datetime
    ) -> AsyncIterator[list[RefundView]]:
        """Refunds created in the window, a page at a time, newest first."""
        ...

    async def retrieve_payment_intent(
        self, payment_intent_id: str, *, with_charge: bool = False
    ) -> PaymentIntentView:
        """One PaymentIntent by id."""
        ...

    async def retrieve_refund(self, refund_id: str) -> RefundView:
        """One refund by id."""
        ...


class PaymentsAuditor:
    """The ``Auditor`` of the payment tools: Stripe against onceflow's records.

    Audit one Stripe account at a time: the records do not say which account a step
    charged, so the provider must be the one the workers use (``[stripe]``).
    """

    def __init__(
        self,
        provider: AuditedPaymentProvider,
        pool: AsyncConnectionPool,
        *,
        tools: Collection[str] = AUDITED_TOOLS,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """Audit ``provider`` against the records in ``pool``.

        Args:
            provider: The provider the payment tools use.
            pool: onceflow's database.
            tools: Whose records to compare. Default ``charge_payment`` and
                ``refund_payment``.
            clock: The audit's "now" (for the in-flight grace). Default: the wall clock.
        """
        self._provider = provider
        self._pool = pool
        self._tools = tuple(tools)
        self._clock = clock

    @property
    def family(self) -> str:
        """``payments``."""
        return FAMILY

    async def audit(
        self, window: AuditWindow, *, progress: AuditProgress | None = None
    ) -> AuditReport:
        """Compare the window's PaymentIntents and refunds with onceflow's records.

        Raises:
            ProviderUnreadable: A page or a resource could not be read.
        """
        try:
            return await self._audit(window, progress)
        except PaymentProviderError as failure:
            raise unreadable(failure) from None

    async def _audit(self, window: AuditWindow, progress: AuditProgress | None) -> AuditReport:
        report = progress or (lambda what, done: None)
        audited_at = self._clock()
        effects: list[ProviderEffect] = []
        span = (window.until - window.since).total_seconds()
        bounds = {"created_from": window.since, "created_before": window.until}
        async for intents in self._provider.payment_intent_pages(**bounds):
            effects += [ProviderEffect.of_intent(intent) for intent in intents]
            report("PaymentIntents", _read_back_to(intents, window.until, span))
        report("PaymentIntents", 1.0)
        async for refunds in self._provider.refund_pages(**bounds):
            effects += [ProviderEffect.of_refund(refund) for refund in refunds]
            report("refunds", _read_back_to(refunds, window.until, span))
        report("refunds", 1.0)
        operations = await read_operations(
            self._pool, tools=self._tools, since=window.since, until=window.until
        )
        step_operations = await read_step_operations(
            self._pool, tools=self._tools, steps=unowned_steps(effects, operations)
        )
        report("records", 1.0)
        unlisted = unlisted_resources(effects, operations)
        retrieved: dict[str, ProviderEffect | None] = {}
        for index, (kind, resource_id) in enumerate(unlisted, start=1):
            retrieved[resource_id] = await self._retrieve(kind, resource_id)
            report("unlisted resources", index / len(unlisted))
        return compare_payments(
            PaymentsAuditInput(
                window=window,
                audited_at=audited_at,
                effects=effects,
                operations=operations,
                step_operations=step_operations,
                retrieved=retrieved,
            )
        )

    async def _retrieve(self, kind: str, resource_id: str) -> ProviderEffect | None:
        """The resource by id; None when the provider answers that it has no such thing."""
        try:
            if kind == CHARGE_CHILD_OP:
                return ProviderEffect.of_intent(
                    await self._provider.retrieve_payment_intent(resource_id)
                )
            return ProviderEffect.of_refund(await self._provider.retrieve_refund(resource_id))
        except PaymentProviderError as failure:
            if failure.http_status == 404 and failure.code == "resource_missing":
                return None
            raise


def _read_back_to(
    page: Sequence[PaymentIntentView] | Sequence[RefundView], until: datetime, span: float
) -> float:
    """How much of the window a newest-first list has read once it reached ``page``."""
    if not page:
        return 1.0
    oldest = min(view.created for view in page)
    return min(1.0, max(0.0, (until.timestamp() - oldest) / span))


def unreadable(failure: PaymentProviderError) -> ProviderUnreadable:
    """What an audit tells of a Stripe read that failed."""
    if failure.http_status in (401, 403):
        return ProviderUnreadable(
            failure.reason, fix="check STRIPE_API_KEY", credentials_refused=True
        )
    if failure.http_status is None or failure.http_status in (429, 500, 502, 503, 504):
        return ProviderUnreadable(
            failure.reason,
            fix="run it again (check STRIPE_API_BASE if it persists)",
            transient=True,
        )
    return ProviderUnreadable(failure.reason, fix="see the reason: Stripe refused the read")
