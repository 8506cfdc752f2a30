"""Performs ``charge_payment`` and ``refund_payment`` at the payment provider, and looks
them up by their correlation ids before a step parks.

One attempt::

    child key = derive_child_key(tenant, workflow, step, "charge"|"refund", account)
      │
      ├─ recorded 'succeeded' locally? ──▶ report that result; no call
      ├─ record 'started' (fails ─▶ transient: nothing was sent)
      ├─ POST, Idempotency-Key = child key, metadata onceflow_operation = key digest
      │    ├─ answered ─▶ persist resource and request ids ─▶ succeeded
      │    │              (persisting fails ─▶ unknown, ids in evidence: a repeat replays)
      │    ├─ rejected ─▶ record 'failed' ─▶ rejected
      │    ├─ 5xx replayed for the key ─▶ search once by operation id ─▶ found: succeeded
      │    └─ otherwise its class (transient / unknown) with the evidence
      ▼
    the workflow decides (activities never retry)

Lookups prefer strongly consistent reads: the locally recorded resource, then a resource
id an earlier attempt saw, then (charges only) Stripe's search by operation id, where a
miss proves nothing because search is eventually consistent.
"""

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from temporalio import activity

from onceflow.payments import (
    OPERATION_METADATA_KEY,
    ChargeRequest,
    PaymentIntentView,
    PaymentProvider,
    PaymentProviderError,
    RefundRequest,
    RefundView,
)
from onceflow.retry_policy import OutcomeClass
from onceflow.tools import (
    CHARGE_PAYMENT,
    REFUND_PAYMENT,
    ChargePaymentInput,
    RefundPaymentInput,
    ToolAttemptResult,
    ToolCallInput,
    derive_child_key,
    key_digest,
)
from onceflow.tools.payments import CHARGE_CHILD_OP, LOOK_UP_CHARGE, LOOK_UP_REFUND, REFUND_CHILD_OP

_log = logging.getLogger(__name__)

CHARGED = frozenset({"succeeded", "processing", "requires_capture"})
"""PaymentIntent statuses where the charge exists (money moved or is moving)."""
REFUNDED = frozenset({"succeeded", "pending", "requires_action"})
"""Refund statuses where the refund exists."""

_RECORDED = """
SELECT state, resource_id, provider_request_id, result FROM operations
WHERE child_key = %(child_key)s
"""
_START = """
INSERT INTO operations (child_key, tenant, workflow_id, step_id, tool, child_op, state)
VALUES (%(child_key)s, %(tenant)s, %(workflow_id)s, %(step_id)s, %(tool)s, %(child_op)s,
        'started')
ON CONFLICT (child_key) DO NOTHING
"""
_SUCCEEDED = """
INSERT INTO operations
    (child_key, tenant, workflow_id, step_id, tool, child_op, state, resource_id,
     provider_request_id, result)
VALUES (%(child_key)s, %(tenant)s, %(workflow_id)s, %(step_id)s, %(tool)s, %(child_op)s,
        'succeeded', %(resource_id)s, %(request_id)s, %(result)s)
ON CONFLICT (child_key) DO UPDATE SET
    state = 'succeeded',
    resource_id = EXCLUDED.resource_id,
    provider_request_id = COALESCE(EXCLUDED.provider_request_id, operations.provider_request_id),
    result = EXCLUDED.result,
    updated_at = now()
"""
_FAILED = """
UPDATE operations
SET state = 'failed', result = %(result)s, updated_at = now(),
    provider_request_id = COALESCE(%(request_id)s, provider_request_id)
WHERE child_key = %(child_key)s AND state <> 'succeeded'
"""


@dataclass(frozen=True)
class _Operation:
    """One child operation's identity: its derived key and the ids safe to show."""

    call: ToolCallInput
    child_op: str
    child_key: str

    @classmethod
    def of(cls, call: ToolCallInput, child_op: str, account: str) -> "_Operation":
        return cls(
            call=call,
            child_op=child_op,
            child_key=derive_child_key(
                tenant=call.tenant,
                workflow_id=call.workflow_id,
                step_id=call.step_id,
                child_op=child_op,
                provider_account=account,
            ),
        )

    @property
    def operation_id(self) -> str:
        """The child key's digest: the metadata value a lookup searches for."""
        return key_digest(self.child_key)

    @property
    def metadata(self) -> dict[str, str]:
        return {
            OPERATION_METADATA_KEY: self.operation_id,
            "onceflow_tenant": self.call.tenant,
            "onceflow_workflow_id": self.call.workflow_id,
            "onceflow_step": self.call.step_id,
        }

    def params(self, **extra: Any) -> dict[str, Any]:
        return {
            "child_key": self.child_key,
            "tenant": self.call.tenant,
            "workflow_id": self.call.workflow_id,
            "step_id": self.call.step_id,
            "tool": self.call.tool,
            "child_op": self.child_op,
            **extra,
        }


class _NotSent(Exception):
    """The local record could not be read or written, so nothing was sent."""


class PaymentActivities:
    """The payment tools' activities, bound to a payment provider and the worker's pool.

    Args:
        provider: The payment provider; None when the worker has no Stripe key, in which
            case every call is rejected with a reason saying so.
        pool: The worker's database pool, for the ``operations`` records.

    Raises:
        ValueError: The payment contracts' attempt timeout is too short for two provider
            calls (an attempt could be cut off while its request is still in flight).
    """

    def __init__(self, provider: PaymentProvider | None, pool: AsyncConnectionPool) -> None:
        self._provider = provider
        self._pool = pool
        if provider is not None:
            for contract in (CHARGE_PAYMENT, REFUND_PAYMENT):
                if contract.attempt_timeout <= 2 * provider.request_timeout:
                    raise ValueError(
                        f"{contract.name}'s attempt timeout ({contract.attempt_timeout}) "
                        f"must exceed two provider calls (2 × {provider.request_timeout}); "
                        "raise ONCEFLOW_PAYMENTS_ATTEMPT_TIMEOUT or lower "
                        "ONCEFLOW_STRIPE_REQUEST_TIMEOUT / ONCEFLOW_STRIPE_CONNECT_TIMEOUT"
                    )

    # ── charge ──────────────────────────────────────────────────────────────────────

    @activity.defn(name=CHARGE_PAYMENT.name)
    async def charge_payment(self, call: ToolCallInput) -> ToolAttemptResult:
        """Create and confirm one PaymentIntent for the step; a repeat gets the same one.

        The documented result: ``payment_intent``, ``status``, ``amount``, ``currency``,
        ``charge``, ``request_id`` (the request that charged), ``replayed`` (Stripe
        replayed an earlier answer) and ``found_by`` (``response``, ``local_record`` or
        ``lookup:…``).
        """
        arguments = ChargePaymentInput.model_validate(call.arguments)
        if self._provider is None:
            return _not_configured()
        provider = self._provider
        op = _Operation.of(call, CHARGE_CHILD_OP, provider.account)
        evidence = {"child_key_digest": op.operation_id}
        try:
            earlier = await self._begin(op)
        except _NotSent as not_sent:
            return _report(op, OutcomeClass.TRANSIENT, str(not_sent), evidence)
        if earlier is not None:
            return earlier
        evidence["sent_at"] = _now()
        try:
            intent = await provider.create_payment_intent(
                ChargeRequest(
                    amount=arguments.amount,
                    currency=arguments.currency,
                    customer=arguments.customer,
                    payment_method=arguments.payment_method,
                    description=f"order {arguments.order_id}",
                    metadata={**op.metadata, "order_id": arguments.order_id},
                ),
                idempotency_key=op.child_key,
            )
        except PaymentProviderError as failure:
            evidence.update(_failure_evidence(failure))
            if failure.replayed and failure.outcome is OutcomeClass.UNKNOWN:
                # Stripe replays a stored 5xx for as long as it keeps the key, so a repeat
                # can never turn it into an answer: ask the search index instead.
                found = await self._search_charge(op, evidence)
                if found is not None:
                    return await self._succeed_charge(op, found, "lookup:search", evidence)
            return await self._fail(op, failure, evidence)
        return await self._succeed_charge(op, intent, "response", evidence)

    async def _succeed_charge(
        self, op: _Operation, intent: PaymentIntentView, found_by: str, evidence: dict[str, str]
    ) -> ToolAttemptResult:
        evidence.update(_intent_evidence(intent))
        if intent.status not in CHARGED:
            reason = f"PaymentIntent {intent.id} is {intent.status}: no money moved"
            await self._record_failure(op, {"payment_intent": intent.id, "status": intent.status})
            return _report(op, OutcomeClass.REJECTED, reason, evidence)
        result = {
            "payment_intent": intent.id,
            "status": intent.status,
            "amount": intent.amount,
            "currency": intent.currency,
            "charge": intent.latest_charge,
            "request_id": intent.reply.committing_request_id,
            "replayed": intent.reply.replayed,
            "found_by": found_by,
        }
        return await self._persist_success(op, intent.id, result, evidence)

    # ── refund ──────────────────────────────────────────────────────────────────────

    @activity.defn(name=REFUND_PAYMENT.name)
    async def refund_payment(self, call: ToolCallInput) -> ToolAttemptResult:
        """Refund the named charge once for the step; a repeat gets the same refund.

        The documented result: ``refund``, ``payment_intent``, ``status``, ``amount``,
        ``currency``, ``request_id``, ``replayed`` and ``found_by``.
        """
        arguments = RefundPaymentInput.model_validate(call.arguments)
        if self._provider is None:
            return _not_configured()
        provider = self._provider
        op = _Operation.of(call, REFUND_CHILD_OP, provider.account)
        evidence = {"child_key_digest": op.operation_id}
        try:
            earlier = await self._begin(op)
            payment_intent = arguments.payment_intent or await self._charged_intent(
                call, arguments.charge_step or "", provider.account
            )
        except _NotSent as not_sent:
            return _report(op, OutcomeClass.TRANSIENT, str(not_sent), evidence)
        if earlier is not None:
            return earlier
        if payment_intent is None:
            reason = (
                f"step {arguments.charge_step!r} has no recorded PaymentIntent: it must be an "
                "earlier charge_payment step of this task that succeeded"
            )
            return _report(op, OutcomeClass.REJECTED, reason, evidence)
        evidence["sent_at"] = _now()
        try:
            refund = await provider.create_refund(
                RefundRequest(
                    payment_intent=payment_intent,
                    amount=arguments.amount,
                    reason=arguments.reason,
                    metadata=op.metadata,
                ),
                idempotency_key=op.child_key,
            )
        except PaymentProviderError as failure:
            evidence.update(_failure_evidence(failure))
            return await self._fail(op, failure, evidence)
        return await self._succeed_refund(op, refund, "response", evidence)

    async def _succeed_refund(
        self, op: _Operation, refund: RefundView, found_by: str, evidence: dict[str, str]
    ) -> ToolAttemptResult:
        evidence.update(_refund_evidence(refund))
        if refund.status not in REFUNDED:
            reason = f"refund {refund.id} is {refund.status}: no money was returned"
            await self._record_failure(op, {"refund": refund.id, "status": refund.status})
            return _report(op, OutcomeClass.REJECTED, reason, evidence)
        result = {
            "refund": refund.id,
            "payment_intent": refund.payment_intent,
            "status": refund.status,
            "amount": refund.amount,
            "currency": refund.currency,
            "request_id": refund.reply.committing_request_id,
            "replayed": refund.reply.replayed,
            "found_by": found_by,
        }
        return await self._persist_success(op, refund.id, result, evidence)

    async def _charged_intent(
        self, call: ToolCallInput, charge_step: str, account: str
    ) -> str | None:
        """The PaymentIntent recorded for an earlier charge step of the same task."""
        charge_call = call.model_copy(update={"step_id": charge_step})
        charge = _Operation.of(charge_call, CHARGE_CHILD_OP, account)
        try:
            async with self._pool.connection() as conn:
                row = await (await conn.execute(_RECORDED, charge.params())).fetchone()
        except Exception as error:
            raise _NotSent(
                f"could not read the charge step's record ({type(error).__name__})"
            ) from error
        if row is None or row[0] != "succeeded":
            return None
        return str(row[1]) if row[1] else None

    # ── lookups ─────────────────────────────────────────────────────────────────────

    @activity.defn(name=LOOK_UP_CHARGE)
    async def look_up_charge(self, call: ToolCallInput) -> ToolAttemptResult:
        """Find the step's charge: by a known PaymentIntent id, else by searching.

        Returns ``succeeded`` with the PaymentIntent when found, else ``unknown`` with
        what each read answered (inconclusive: the step parks).
        """
        if self._provider is None:
            return _not_configured(OutcomeClass.UNKNOWN)
        provider = self._provider
        op = _Operation.of(call, CHARGE_CHILD_OP, provider.account)
        evidence = {"child_key_digest": op.operation_id, "lookup_at": _now()}
        known = await self._recorded_resource(op) or call.evidence.get("payment_intent")
        if known:
            try:
                intent = await provider.retrieve_payment_intent(known)
            except PaymentProviderError as failure:
                evidence["lookup_retrieve"] = f"{known}: {failure.reason}"
            else:
                evidence["lookup_retrieve"] = f"{intent.id} is {intent.status}"
                if intent.status in CHARGED:
                    return await self._succeed_charge(op, intent, "lookup:retrieve", evidence)
                reason = (
                    f"PaymentIntent {intent.id} (this step's key) is {intent.status}: no money "
                    "moved on it"
                )
                return _report(op, OutcomeClass.UNKNOWN, reason, evidence)
        found = await self._search_charge(op, evidence)
        if found is not None:
            return await self._succeed_charge(op, found, "lookup:search", evidence)
        return _report(op, OutcomeClass.UNKNOWN, evidence["lookup_search"], evidence)

    async def _search_charge(
        self, op: _Operation, evidence: dict[str, str]
    ) -> PaymentIntentView | None:
        """The one charged PaymentIntent carrying the operation id, if search shows it.

        Records what it saw in ``evidence["lookup_search"]``.
        """
        assert self._provider is not None
        try:
            views = await self._provider.search_payment_intents(op.operation_id)
        except PaymentProviderError as failure:
            evidence["lookup_search"] = f"search failed: {failure.reason}"
            return None
        charged = [view for view in views if view.status in CHARGED]
        if len(charged) == 1:
            evidence["lookup_search"] = f"found {charged[0].id} ({charged[0].status})"
            return charged[0]
        if len(charged) > 1:
            ids = ", ".join(view.id for view in charged)
            evidence["lookup_search"] = (
                f"{len(charged)} charged PaymentIntents carry this operation id ({ids}): "
                "a duplicate charge, reconcile by hand"
            )
        elif views:
            states = ", ".join(f"{view.id} is {view.status}" for view in views)
            evidence["lookup_search"] = f"no charged PaymentIntent found ({states})"
        else:
            evidence["lookup_search"] = (
                "search found nothing; Stripe's search is eventually consistent, so a miss "
                "does not prove the charge did not happen"
            )
        return None

    @activity.defn(name=LOOK_UP_REFUND)
    async def look_up_refund(self, call: ToolCallInput) -> ToolAttemptResult:
        """Find the step's refund by a known refund id; Stripe cannot search refunds.

        Returns ``succeeded`` with the refund when found, else ``unknown`` with the
        charge's refunded amount as a hint for the operator.
        """
        if self._provider is None:
            return _not_configured(OutcomeClass.UNKNOWN)
        provider = self._provider
        op = _Operation.of(call, REFUND_CHILD_OP, provider.account)
        evidence = {"child_key_digest": op.operation_id, "lookup_at": _now()}
        known = await self._recorded_resource(op) or call.evidence.get("refund")
        if known:
            try:
                refund = await provider.retrieve_refund(known)
            except PaymentProviderError as failure:
                evidence["lookup_retrieve"] = f"{known}: {failure.reason}"
            else:
                evidence["lookup_retrieve"] = f"{refund.id} is {refund.status}"
                return await self._succeed_refund(op, refund, "lookup:retrieve", evidence)
        arguments = RefundPaymentInput.model_validate(call.arguments)
        try:
            payment_intent = arguments.payment_intent or await self._charged_intent(
                call, arguments.charge_step or "", provider.account
            )
        except _NotSent:
            payment_intent = None
        if payment_intent is not None:
            try:
                intent = await provider.retrieve_payment_intent(payment_intent, with_charge=True)
            except PaymentProviderError as failure:
                evidence["lookup_charge"] = f"{payment_intent}: {failure.reason}"
            else:
                evidence["lookup_charge"] = (
                    f"{intent.id}: {intent.amount_refunded} of {intent.amount} refunded"
                )
        reason = (
            "no refund id is known and Stripe cannot search refunds by metadata; compare the "
            "charge's refunded amount with this step's refund"
        )
        return _report(op, OutcomeClass.UNKNOWN, reason, evidence)

    # ── the operations record ───────────────────────────────────────────────────────

    async def _begin(self, op: _Operation) -> ToolAttemptResult | None:
        """The earlier success recorded for this operation, else record 'started'."""
        try:
            async with self._pool.connection() as conn:
                row = await (await conn.execute(_RECORDED, op.params())).fetchone()
                if row is not None and row[0] == "succeeded":
                    result = {**row[3], "found_by": "local_record"}
                    evidence = {"child_key_digest": op.operation_id}
                    if row[2]:
                        evidence["request_id"] = row[2]
                    return _report(op, OutcomeClass.SUCCEEDED, None, evidence, row[1], result)
                await conn.execute(_START, op.params())
        except Exception as error:
            raise _NotSent(
                f"could not record the operation before calling the provider "
                f"({type(error).__name__}); nothing was sent"
            ) from error
        return None

    async def _recorded_resource(self, op: _Operation) -> str | None:
        try:
            async with self._pool.connection() as conn:
                row = await (await conn.execute(_RECORDED, op.params())).fetchone()
        except Exception:  # a lookup goes on without the local record
            _log.warning("could not read the operation record of %s", op.operation_id)
            return None
        return str(row[1]) if row is not None and row[0] == "succeeded" and row[1] else None

    async def _persist_success(
        self, op: _Operation, resource_id: str, result: dict[str, Any], evidence: dict[str, str]
    ) -> ToolAttemptResult:
        # The ids must be stored before the step is reported done (reconciliation reads
        # them); if they cannot be, the attempt is unknown and a repeat replays it.
        try:
            async with self._pool.connection() as conn:
                await conn.execute(
                    _SUCCEEDED,
                    op.params(
                        resource_id=resource_id,
                        request_id=result.get("request_id"),
                        result=Jsonb(result),
                    ),
                )
        except Exception as error:
            reason = (
                f"{resource_id} exists at the provider but could not be recorded "
                f"({type(error).__name__}); a repeat with the same key replays it"
            )
            return _report(op, OutcomeClass.UNKNOWN, reason, evidence)
        return _report(op, OutcomeClass.SUCCEEDED, None, evidence, resource_id, result)

    async def _fail(
        self, op: _Operation, failure: PaymentProviderError, evidence: dict[str, str]
    ) -> ToolAttemptResult:
        if failure.outcome is OutcomeClass.REJECTED:
            await self._record_failure(
                op, {"reason": failure.reason, "code": failure.code}, failure.request_id
            )
        return _report(op, failure.outcome, failure.reason, evidence)

    async def _record_failure(
        self, op: _Operation, result: dict[str, Any], request_id: str | None = None
    ) -> None:
        try:
            async with self._pool.connection() as conn:
                await conn.execute(_FAILED, op.params(result=Jsonb(result), request_id=request_id))
        except Exception:  # the failure is reported either way; the record is a courtesy
            _log.warning("could not record the failure of %s", op.operation_id)


def _report(
    op: _Operation,
    outcome: OutcomeClass,
    reason: str | None,
    evidence: dict[str, str],
    resource_id: str | None = None,
    result: dict[str, Any] | None = None,
) -> ToolAttemptResult:
    # Logged with the key's digest and correlation ids only: never the key or card data.
    _log.info(
        "%s %s: %s (workflow %s, step %s, attempt %d, key %s, request %s)",
        op.call.tool,
        op.child_op,
        outcome.value,
        op.call.workflow_id,
        op.call.step_id,
        op.call.attempt,
        op.operation_id,
        evidence.get("request_id"),
    )
    return ToolAttemptResult(
        outcome=outcome,
        resource_id=resource_id,
        result=result or {},
        reason=reason,
        evidence=evidence,
    )


def _not_configured(outcome: OutcomeClass = OutcomeClass.REJECTED) -> ToolAttemptResult:
    return ToolAttemptResult(
        outcome=outcome,
        reason="payments are not configured on this worker: set STRIPE_API_KEY",
    )


def _failure_evidence(failure: PaymentProviderError) -> dict[str, str]:
    evidence = {"answered_at": _now()}
    if failure.request_id:
        evidence["request_id"] = failure.request_id
    if failure.http_status is not None:
        evidence["http_status"] = str(failure.http_status)
    if failure.code:
        evidence["provider_code"] = failure.code
    if failure.replayed:
        evidence["replayed"] = "true"
    if failure.payment_intent:
        evidence["payment_intent"] = failure.payment_intent
    if failure.http_status is None:
        evidence["response"] = "none: " + failure.reason
    return evidence


def _intent_evidence(intent: PaymentIntentView) -> dict[str, str]:
    evidence = {"payment_intent": intent.id, "answered_at": _now()}
    if intent.reply.request_id:
        evidence["request_id"] = intent.reply.request_id
    if intent.reply.replayed:
        evidence["replayed"] = "true"
        evidence["original_request_id"] = intent.reply.original_request_id or ""
    return evidence


def _refund_evidence(refund: RefundView) -> dict[str, str]:
    evidence = {"refund": refund.id, "answered_at": _now()}
    if refund.payment_intent:
        evidence["payment_intent"] = refund.payment_intent
    if refund.reply.request_id:
        evidence["request_id"] = refund.reply.request_id
    if refund.reply.replayed:
        evidence["replayed"] = "true"
        evidence["original_request_id"] = refund.reply.original_request_id or ""
    return evidence


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
