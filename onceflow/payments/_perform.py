"""Performs ``charge_payment`` and ``refund_payment`` at the payment provider (their
look-ups by correlation ids before a step parks are in ``_look_ups``).

One attempt::

    child key = the step's derived key for "charge" | "refund" at the provider account
      │
      ├─ recorded 'succeeded' already? ──▶ report that result; no call
      ├─ record 'started' and the key's first send (fails ─▶ transient: nothing was sent;
      │    past the key's send-by deadline ─▶ nothing sent, the workflow looks up, parks)
      ├─ POST, Idempotency-Key = child key, metadata onceflow_operation = key digest
      │    ├─ answered ─▶ record resource and request ids ─▶ succeeded
      │    │              (recording fails ─▶ unknown, ids in evidence: a repeat replays)
      │    ├─ rejected ─▶ record 'failed' ─▶ rejected
      │    ├─ 500 replayed (``Idempotent-Replayed: true``: Stripe stored it under the key
      │    │   and replays it for every repeat) ─▶ list look-up by operation id
      │    │     ─▶ found: succeeded
      │    │     ─▶ else unknown, the key holds a stored failure: the workflow looks up
      │    │        and parks, never POSTs it again
      │    ├─ 500 answered afresh ─▶ unknown: Stripe stores a 500 only if the endpoint
      │    │   began executing, so one same-key repeat (inside the key's window, which
      │    │   the workflow's budget allows) either runs afresh or shows it was stored
      │    └─ otherwise its class (transient / unknown) with the evidence
      ▼
    the workflow decides (a perform never retries)

Lookups read only what is strongly consistent first: the locally recorded resource, a
resource id an earlier attempt saw, then the list API (a charge among its customer's
PaymentIntents since the key's first send, a refund among its PaymentIntent's refunds),
matched by the operation id in the metadata: a miss there means the effect does not
exist. Stripe's search (eventually consistent: a miss proves nothing) is used for a charge
only when the list cannot be read.

Request ids and resource ids are recorded with the operation (``payment_intent``,
``refund``, ``request_id``, and ``original_request_id`` when Stripe replayed an answer);
what an attempt saw besides (timings, HTTP status, what a read answered) is evidence of
that attempt only.
"""

from datetime import timedelta
from typing import Any

from onceflow.payments._contract import ChargePaymentInput, RefundPaymentInput
from onceflow.payments._errors import PaymentProviderError
from onceflow.payments._look_ups import find_charge, find_refund
from onceflow.payments._outcomes import (
    CHARGE_CHILD_OP,
    REFUND_CHILD_OP,
    charged_intent,
    not_configured,
    now_text,
    succeed_charge,
    succeed_refund,
)
from onceflow.payments._provider import (
    OPERATION_METADATA_KEY,
    ChargeRequest,
    PaymentProvider,
    RefundRequest,
)
from onceflow.tools import ChildOperation, OutcomeClass, ToolAttemptResult, ToolCall


async def charge_payment(call: ToolCall[ChargePaymentInput]) -> ToolAttemptResult:
    """Create and confirm one PaymentIntent for the step; a repeat gets the same one.

    The documented result: ``payment_intent``, ``status``, ``amount``, ``currency``,
    ``charge``, ``request_id`` (the request that charged), ``replayed`` (Stripe
    replayed an earlier answer) and ``found_by`` (``response``, ``local_record`` or
    ``lookup:…``).
    """
    provider: PaymentProvider | None = call.client
    if provider is None:
        return not_configured()
    arguments = call.args
    operation = await call.begin(CHARGE_CHILD_OP, provider_account=provider.account)
    if operation.earlier_success:
        return _found_in_local_record(operation.earlier_success)
    attempt = {"sent_at": now_text()}
    try:
        intent = await provider.create_payment_intent(
            ChargeRequest(
                amount=arguments.amount,
                currency=arguments.currency,
                customer=arguments.customer,
                payment_method=arguments.payment_method,
                description=f"order {arguments.order_id}",
                metadata={**_metadata(call, operation), "order_id": arguments.order_id},
            ),
            idempotency_key=operation.key,
        )
    except PaymentProviderError as failure:
        attempt.update(_failure_evidence(failure))
        if _stored_by_provider(failure):
            # Stripe replays a stored 500 for as long as it keeps the key, so a repeat
            # can never turn it into an answer: look the charge up instead.
            search = await find_charge(provider, operation, arguments.customer, attempt)
            if search.found is not None:
                return await succeed_charge(operation, search.found, search.how, attempt)
            return await _stored_failure(operation, failure, attempt)
        return await _fail(operation, failure, attempt)
    return await succeed_charge(operation, intent, "response", attempt)


async def refund_payment(call: ToolCall[RefundPaymentInput]) -> ToolAttemptResult:
    """Refund the named charge once for the step; a repeat gets the same refund.

    The documented result: ``refund``, ``payment_intent``, ``status``, ``amount``,
    ``currency``, ``request_id``, ``replayed`` and ``found_by``.
    """
    provider: PaymentProvider | None = call.client
    if provider is None:
        return not_configured()
    arguments = call.args
    operation = await call.begin(REFUND_CHILD_OP, provider_account=provider.account)
    if operation.earlier_success:
        return _found_in_local_record(operation.earlier_success)
    payment_intent = arguments.payment_intent or await charged_intent(
        call, arguments.charge_step or "", provider.account
    )
    if payment_intent is None:
        reason = (
            f"step {arguments.charge_step!r} has no recorded PaymentIntent: it must be an "
            "earlier charge_payment step of this task that succeeded"
        )
        return await operation.failed(OutcomeClass.REJECTED, reason)
    attempt = {"sent_at": now_text()}
    try:
        refund = await provider.create_refund(
            RefundRequest(
                payment_intent=payment_intent,
                amount=arguments.amount,
                reason=arguments.reason,
                metadata=_metadata(call, operation),
            ),
            idempotency_key=operation.key,
        )
    except PaymentProviderError as failure:
        attempt.update(_failure_evidence(failure))
        if _stored_by_provider(failure):
            found = await find_refund(provider, operation, payment_intent, attempt)
            if found is not None:
                return await succeed_refund(operation, found, "lookup:list", attempt)
            return await _stored_failure(operation, failure, attempt)
        return await _fail(operation, failure, attempt)
    return await succeed_refund(operation, refund, "response", attempt)


async def _fail(
    operation: ChildOperation, failure: PaymentProviderError, attempt: dict[str, str]
) -> ToolAttemptResult:
    ids = {"request_id": failure.request_id, "payment_intent": failure.payment_intent}
    result = await operation.failed(
        failure.outcome,
        failure.reason,
        evidence=attempt,
        **{name: value for name, value in ids.items() if value},
    )
    if failure.throttled:
        # Stripe's "not now": its budget holds every send for the time it asked.
        return result.model_copy(update={"throttled_for": failure.retry_after or timedelta(0)})
    return result


def _stored_by_provider(failure: PaymentProviderError) -> bool:
    # Stripe saves a 500 under the key once the endpoint began executing, and replays
    # it for every repeat while it keeps the key: a repeat can never turn it into an
    # answer. Only the replay proves it was stored: a fresh 500 may not have been.
    return failure.http_status == 500 and failure.replayed


async def _stored_failure(
    operation: ChildOperation, failure: PaymentProviderError, attempt: dict[str, str]
) -> ToolAttemptResult:
    ids = {"request_id": failure.request_id, "payment_intent": failure.payment_intent}
    return await operation.stored_failure(
        f"Stripe answered HTTP 500 ({failure.reason})",
        evidence=attempt,
        **{name: value for name, value in ids.items() if value},
    )


def _metadata(call: ToolCall[Any], operation: ChildOperation) -> dict[str, str]:
    # The key's digest, never the key: a lookup searches for it, operators see it.
    return {
        OPERATION_METADATA_KEY: operation.key_digest,
        "onceflow_tenant": call.tenant,
        "onceflow_workflow_id": call.workflow_id,
        "onceflow_step": call.step_id,
    }


def _found_in_local_record(success: ToolAttemptResult) -> ToolAttemptResult:
    return success.model_copy(update={"result": {**success.result, "found_by": "local_record"}})


def _failure_evidence(failure: PaymentProviderError) -> dict[str, str]:
    evidence = {"answered_at": now_text()}
    if failure.http_status is not None:
        evidence["http_status"] = str(failure.http_status)
    if failure.code:
        evidence["provider_code"] = failure.code
    if failure.replayed:
        evidence["replayed"] = "true"
    if failure.http_status is None:
        evidence["response"] = "none: " + failure.reason
    return evidence
