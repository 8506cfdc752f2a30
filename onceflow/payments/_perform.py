"""Performs ``charge_payment`` and ``refund_payment`` at the payment provider, and looks
them up by their correlation ids before a step parks.

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

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from onceflow.payments._contract import ChargePaymentInput, RefundPaymentInput
from onceflow.payments._errors import PaymentProviderError
from onceflow.payments._provider import (
    OPERATION_METADATA_KEY,
    ChargeRequest,
    PaymentIntentView,
    PaymentProvider,
    ProviderReply,
    RefundRequest,
    RefundView,
)
from onceflow.tools import ChildOperation, NothingSent, OutcomeClass, ToolAttemptResult, ToolCall

CHARGE_CHILD_OP = "charge"
"""Child operation name of a charge in its derived key."""
REFUND_CHILD_OP = "refund"
"""Child operation name of a refund in its derived key."""
CLOCK_MARGIN = timedelta(minutes=10)
"""How far a list look-up reaches before the key's first send (onceflow's database
clock) for the provider's creation time of the charge (its own clock)."""
SEARCH_LAG = timedelta(hours=1)
"""How long after the key's last attempt a miss in Stripe's search proves absence: data
is searchable within a minute normally, and up to an hour during an outage."""
CHARGED = frozenset({"succeeded", "processing", "requires_capture"})
"""PaymentIntent statuses where the charge exists (money moved or is moving)."""
REFUNDED = frozenset({"succeeded", "pending", "requires_action"})
"""Refund statuses where the refund exists."""


# ── charge ──────────────────────────────────────────────────────────────────────────


async def charge_payment(call: ToolCall[ChargePaymentInput]) -> ToolAttemptResult:
    """Create and confirm one PaymentIntent for the step; a repeat gets the same one.

    The documented result: ``payment_intent``, ``status``, ``amount``, ``currency``,
    ``charge``, ``request_id`` (the request that charged), ``replayed`` (Stripe
    replayed an earlier answer) and ``found_by`` (``response``, ``local_record`` or
    ``lookup:…``).
    """
    provider: PaymentProvider | None = call.client
    if provider is None:
        return _not_configured()
    arguments = call.args
    operation = await call.begin(CHARGE_CHILD_OP, provider_account=provider.account)
    if operation.earlier_success:
        return _found_in_local_record(operation.earlier_success)
    attempt = {"sent_at": _now()}
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
            search = await _find_charge(provider, operation, arguments.customer, attempt)
            if search.found is not None:
                return await _succeed_charge(operation, search.found, search.how, attempt)
            return await _stored_failure(operation, failure, attempt)
        return await _fail(operation, failure, attempt)
    return await _succeed_charge(operation, intent, "response", attempt)


async def _succeed_charge(
    operation: ChildOperation, intent: PaymentIntentView, found_by: str, attempt: dict[str, str]
) -> ToolAttemptResult:
    attempt.update(_answer_evidence(intent.reply))
    ids = {"payment_intent": intent.id, **_reply_ids(intent.reply)}
    if intent.status not in CHARGED:
        reason = f"PaymentIntent {intent.id} is {intent.status}: no money moved"
        return await operation.failed(OutcomeClass.REJECTED, reason, evidence=attempt, **ids)
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
    return await operation.succeeded(intent.id, result, evidence=attempt, **ids)


# ── refund ──────────────────────────────────────────────────────────────────────────


async def refund_payment(call: ToolCall[RefundPaymentInput]) -> ToolAttemptResult:
    """Refund the named charge once for the step; a repeat gets the same refund.

    The documented result: ``refund``, ``payment_intent``, ``status``, ``amount``,
    ``currency``, ``request_id``, ``replayed`` and ``found_by``.
    """
    provider: PaymentProvider | None = call.client
    if provider is None:
        return _not_configured()
    arguments = call.args
    operation = await call.begin(REFUND_CHILD_OP, provider_account=provider.account)
    if operation.earlier_success:
        return _found_in_local_record(operation.earlier_success)
    payment_intent = arguments.payment_intent or await _charged_intent(
        call, arguments.charge_step or "", provider.account
    )
    if payment_intent is None:
        reason = (
            f"step {arguments.charge_step!r} has no recorded PaymentIntent: it must be an "
            "earlier charge_payment step of this task that succeeded"
        )
        return await operation.failed(OutcomeClass.REJECTED, reason)
    attempt = {"sent_at": _now()}
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
            found = await _find_refund(provider, operation, payment_intent, attempt)
            if found is not None:
                return await _succeed_refund(operation, found, "lookup:list", attempt)
            return await _stored_failure(operation, failure, attempt)
        return await _fail(operation, failure, attempt)
    return await _succeed_refund(operation, refund, "response", attempt)


async def _succeed_refund(
    operation: ChildOperation, refund: RefundView, found_by: str, attempt: dict[str, str]
) -> ToolAttemptResult:
    attempt.update(_answer_evidence(refund.reply))
    ids = {"refund": refund.id, **_reply_ids(refund.reply)}
    if refund.payment_intent:
        ids["payment_intent"] = refund.payment_intent
    if refund.status not in REFUNDED:
        reason = f"refund {refund.id} is {refund.status}: no money was returned"
        return await operation.failed(OutcomeClass.REJECTED, reason, evidence=attempt, **ids)
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
    return await operation.succeeded(refund.id, result, evidence=attempt, **ids)


async def _charged_intent(
    call: ToolCall[RefundPaymentInput], charge_step: str, account: str
) -> str | None:
    """The PaymentIntent recorded for an earlier charge step of the same task.

    Raises:
        NothingSent: The record could not be read (nothing was sent yet).
    """
    charge = await call.find(CHARGE_CHILD_OP, provider_account=account, step_id=charge_step)
    if charge.state != "succeeded":
        return None
    return charge.resource_id or None


# ── lookups ─────────────────────────────────────────────────────────────────────────


async def look_up_charge(call: ToolCall[ChargePaymentInput]) -> ToolAttemptResult:
    """Find the step's charge: by a known PaymentIntent id, else in its customer's list.

    Returns ``succeeded`` with the PaymentIntent when found, else ``unknown`` with
    what each read answered (inconclusive: the step parks).
    """
    provider: PaymentProvider | None = call.client
    if provider is None:
        return _not_configured(OutcomeClass.UNKNOWN)
    operation = await call.find(CHARGE_CHILD_OP, provider_account=provider.account)
    looked = {"lookup_at": _now()}
    if call.claimed_resource_id is not None:
        return await _verify_claimed_charge(call, provider, operation, looked)
    known = _recorded_resource(operation) or call.evidence.get("payment_intent")
    if known:
        try:
            intent = await provider.retrieve_payment_intent(known)
        except PaymentProviderError as failure:
            looked["lookup_retrieve"] = f"{known}: {failure.reason}"
        else:
            looked["lookup_retrieve"] = f"{intent.id} is {intent.status}"
            if intent.status in CHARGED:
                return await _succeed_charge(operation, intent, "lookup:retrieve", looked)
            reason = (
                f"PaymentIntent {intent.id} (this step's key) is {intent.status}: no money "
                "moved on it"
            )
            # A consistent read; an earlier key generation's charge would be another one.
            return _inconclusive(operation, reason, looked, absent=operation.generation == 1)
    search = await _find_charge(provider, operation, call.args.customer, looked)
    if search.found is not None:
        return await _succeed_charge(operation, search.found, search.how, looked)
    return _inconclusive(
        operation,
        looked.get("lookup_search") or looked["lookup_list"],
        looked,
        absent=search.proves_absence,
        absent_after=search.proves_absence_after,
    )


async def _verify_claimed_charge(
    call: ToolCall[ChargePaymentInput],
    provider: PaymentProvider,
    operation: ChildOperation,
    looked: dict[str, str],
) -> ToolAttemptResult:
    """Check the PaymentIntent an operator says the step made: it exists, carries this
    step's operation id, is charged, and is for the step's amount and currency. When it
    is, it is recorded as the step's charge (a refund by ``charge_step`` reads it)."""
    claimed = call.claimed_resource_id or ""
    try:
        intent = await provider.retrieve_payment_intent(claimed)
    except PaymentProviderError as failure:
        looked["lookup_claimed"] = f"{claimed}: {failure.reason}"
        if call.accept_unverified:
            return await _record_unverified(operation, "payment_intent", claimed, looked)
        return _inconclusive(
            operation, f"PaymentIntent {claimed} could not be read: {failure.reason}", looked
        )
    arguments = call.args
    seen = (
        f"{intent.id} is {intent.status}, {intent.amount} {intent.currency}, operation id "
        f"{intent.metadata.get(OPERATION_METADATA_KEY) or 'none'}"
    )
    looked["lookup_claimed"] = seen
    problems = []
    if intent.metadata.get(OPERATION_METADATA_KEY) not in operation.key_digests:
        problems.append(f"it is not this step's charge ({_operation_ids(operation)})")
    if (intent.amount, intent.currency.lower()) != (arguments.amount, arguments.currency.lower()):
        problems.append(f"the step charges {arguments.amount} {arguments.currency}")
    if intent.status not in CHARGED:
        problems.append("no money moved on it")
    if problems and call.accept_unverified:
        looked["lookup_claimed"] = f"{seen}: " + "; ".join(problems)
        return await _record_unverified(operation, "payment_intent", claimed, looked)
    if problems:
        return _inconclusive(operation, f"PaymentIntent {seen}: " + "; ".join(problems), looked)
    return await _succeed_charge(operation, intent, "lookup:operator", looked)


async def _find_charge(
    provider: PaymentProvider,
    operation: ChildOperation,
    customer: str,
    evidence: dict[str, str],
) -> "_Search":
    """The one charged PaymentIntent carrying the operation id (of any key generation),
    from the customer's list (consistent), else, when the list cannot be read, from
    search. What each read saw goes into ``evidence``."""
    created_from = None
    if operation.first_sent_at is not None and operation.generation == 1:
        # An earlier generation's charge may predate this key's first send.
        created_from = operation.first_sent_at - CLOCK_MARGIN
    try:
        views = await provider.list_payment_intents(customer=customer, created_from=created_from)
    except PaymentProviderError as failure:
        evidence["lookup_list"] = f"the list could not be read: {failure.reason}"
        found = await _search_charge(provider, operation, evidence)
        searched = "search failed" not in evidence["lookup_search"]
        return _Search(
            found, "lookup:search", proves_absence_after=SEARCH_LAG if searched else None
        )
    mine = [
        view for view in views if view.metadata.get(OPERATION_METADATA_KEY) in operation.key_digests
    ]
    since = f" since {created_from.isoformat(timespec='seconds')}" if created_from else ""
    found = _one_charged(
        mine,
        evidence,
        "lookup_list",
        miss=(
            f"none of the customer's {len(views)} PaymentIntents{since} carries this "
            "operation id (the list API is consistent: the charge does not exist)"
        ),
    )
    none_charged = not any(view.status in CHARGED for view in mine)
    return _Search(found, "lookup:list", proves_absence=none_charged)


@dataclass(frozen=True)
class _Search:
    """What a look-up's search for the step's effect found, and what a miss proves."""

    found: PaymentIntentView | None
    how: str
    """``lookup:list`` or ``lookup:search``: the read that decided."""
    proves_absence: bool = False
    proves_absence_after: timedelta | None = None


async def _search_charge(
    provider: PaymentProvider, operation: ChildOperation, evidence: dict[str, str]
) -> PaymentIntentView | None:
    """The one charged PaymentIntent carrying the operation id, if search shows it."""
    views: list[PaymentIntentView] = []
    try:
        for digest in operation.key_digests:
            views.extend(await provider.search_payment_intents(digest))
    except PaymentProviderError as failure:
        evidence["lookup_search"] = f"search failed: {failure.reason}"
        return None
    return _one_charged(
        views,
        evidence,
        "lookup_search",
        miss=(
            "search found nothing; Stripe's search is eventually consistent, so a miss "
            "does not prove the charge did not happen"
        ),
    )


def _one_charged(
    views: list[PaymentIntentView], evidence: dict[str, str], seen: str, *, miss: str
) -> PaymentIntentView | None:
    """The one charged PaymentIntent among the step's ``views``; what was seen goes into
    ``evidence[seen]`` (``miss`` when there are none)."""
    charged = [view for view in views if view.status in CHARGED]
    if len(charged) == 1:
        evidence[seen] = f"found {charged[0].id} ({charged[0].status})"
        return charged[0]
    if len(charged) > 1:
        ids = ", ".join(view.id for view in charged)
        evidence[seen] = (
            f"{len(charged)} charged PaymentIntents carry this operation id ({ids}): "
            "a duplicate charge, reconcile by hand"
        )
    elif views:
        states = ", ".join(f"{view.id} is {view.status}" for view in views)
        evidence[seen] = f"no charged PaymentIntent found ({states})"
    else:
        evidence[seen] = miss
    return None


async def _find_refund(
    provider: PaymentProvider,
    operation: ChildOperation,
    payment_intent: str,
    evidence: dict[str, str],
) -> RefundView | None:
    """The refund of ``payment_intent`` carrying the operation id (any key generation),
    from the PaymentIntent's list of refunds (consistent); what it saw goes into
    ``evidence["lookup_list"]``."""
    try:
        refunds = await provider.list_refunds(payment_intent)
    except PaymentProviderError as failure:
        evidence["lookup_list"] = (
            f"the refunds of {payment_intent} could not be read: {failure.reason}"
        )
        return None
    mine = [r for r in refunds if r.metadata.get(OPERATION_METADATA_KEY) in operation.key_digests]
    made = [refund for refund in mine if refund.status in REFUNDED]
    if len(made) == 1:
        evidence["lookup_list"] = f"found {made[0].id} ({made[0].status})"
        return made[0]
    if len(made) > 1:
        ids = ", ".join(refund.id for refund in made)
        evidence["lookup_list"] = (
            f"{len(made)} refunds carry this operation id ({ids}): a duplicate refund, "
            "reconcile by hand"
        )
    elif mine:
        states = ", ".join(f"{refund.id} is {refund.status}" for refund in mine)
        evidence["lookup_list"] = f"no refund that returned money found ({states})"
    else:
        evidence["lookup_list"] = (
            f"none of the {len(refunds)} refunds of {payment_intent} carries this operation "
            "id (the list API is consistent: the refund does not exist)"
        )
    return None


async def look_up_refund(call: ToolCall[RefundPaymentInput]) -> ToolAttemptResult:
    """Find the step's refund: by a known refund id, else among its PaymentIntent's
    refunds (the list API, consistent).

    Returns ``succeeded`` with the refund when found, else ``unknown`` with what the
    reads saw and the charge's refunded amount.
    """
    provider: PaymentProvider | None = call.client
    if provider is None:
        return _not_configured(OutcomeClass.UNKNOWN)
    operation = await call.find(REFUND_CHILD_OP, provider_account=provider.account)
    looked = {"lookup_at": _now()}
    if call.claimed_resource_id is not None:
        return await _verify_claimed_refund(call, provider, operation, looked)
    known = _recorded_resource(operation) or call.evidence.get("refund")
    if known:
        try:
            refund = await provider.retrieve_refund(known)
        except PaymentProviderError as failure:
            looked["lookup_retrieve"] = f"{known}: {failure.reason}"
        else:
            looked["lookup_retrieve"] = f"{refund.id} is {refund.status}"
            return await _succeed_refund(operation, refund, "lookup:retrieve", looked)
    arguments = call.args
    try:
        payment_intent = arguments.payment_intent or await _charged_intent(
            call, arguments.charge_step or "", provider.account
        )
    except NothingSent:
        payment_intent = None
    if payment_intent is None:
        reason = "the refunded PaymentIntent is not known: nothing to list the refunds of"
        return _inconclusive(operation, reason, looked)
    found = await _find_refund(provider, operation, payment_intent, looked)
    if found is not None:
        return await _succeed_refund(operation, found, "lookup:list", looked)
    absent = looked["lookup_list"].startswith("none of the")
    try:
        intent = await provider.retrieve_payment_intent(payment_intent, with_charge=True)
    except PaymentProviderError as failure:
        looked["lookup_charge"] = f"{payment_intent}: {failure.reason}"
    else:
        looked["lookup_charge"] = (
            f"{intent.id}: {intent.amount_refunded} of {intent.amount} refunded"
        )
    return _inconclusive(operation, looked["lookup_list"], looked, absent=absent)


async def _verify_claimed_refund(
    call: ToolCall[RefundPaymentInput],
    provider: PaymentProvider,
    operation: ChildOperation,
    looked: dict[str, str],
) -> ToolAttemptResult:
    """Check the refund an operator says the step made: it exists, carries this step's
    operation id, and (when the step names them) its amount and PaymentIntent match."""
    claimed = call.claimed_resource_id or ""
    try:
        refund = await provider.retrieve_refund(claimed)
    except PaymentProviderError as failure:
        looked["lookup_claimed"] = f"{claimed}: {failure.reason}"
        if call.accept_unverified:
            return await _record_unverified(operation, "refund", claimed, looked)
        return _inconclusive(
            operation, f"refund {claimed} could not be read: {failure.reason}", looked
        )
    arguments = call.args
    seen = (
        f"{refund.id} is {refund.status}, {refund.amount} {refund.currency} of "
        f"{refund.payment_intent or 'no PaymentIntent'}, operation id "
        f"{refund.metadata.get(OPERATION_METADATA_KEY) or 'none'}"
    )
    looked["lookup_claimed"] = seen
    problems = []
    if refund.metadata.get(OPERATION_METADATA_KEY) not in operation.key_digests:
        problems.append(f"it is not this step's refund ({_operation_ids(operation)})")
    if arguments.amount is not None and refund.amount != arguments.amount:
        problems.append(f"the step refunds {arguments.amount}")
    if arguments.payment_intent and refund.payment_intent != arguments.payment_intent:
        problems.append(f"the step refunds {arguments.payment_intent}")
    if refund.status not in REFUNDED:
        problems.append("no money was returned")
    if problems and call.accept_unverified:
        looked["lookup_claimed"] = f"{seen}: " + "; ".join(problems)
        return await _record_unverified(operation, "refund", claimed, looked)
    if problems:
        return _inconclusive(operation, f"refund {seen}: " + "; ".join(problems), looked)
    return await _succeed_refund(operation, refund, "lookup:operator", looked)


# ── shared ──────────────────────────────────────────────────────────────────────────


async def _fail(
    operation: ChildOperation, failure: PaymentProviderError, attempt: dict[str, str]
) -> ToolAttemptResult:
    ids = {"request_id": failure.request_id, "payment_intent": failure.payment_intent}
    return await operation.failed(
        failure.outcome,
        failure.reason,
        evidence=attempt,
        **{name: value for name, value in ids.items() if value},
    )


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


async def _record_unverified(
    operation: ChildOperation, kind: str, claimed: str, looked: dict[str, str]
) -> ToolAttemptResult:
    """Record the resource an operator accepted unverified as the step's effect."""
    result = {kind: claimed, "verified": False, "found_by": "operator:unverified"}
    return await operation.succeeded(claimed, result, evidence=looked, **{kind: claimed})


def _operation_ids(operation: ChildOperation) -> str:
    return "this step's operation id is " + " or ".join(operation.key_digests)


def _recorded_resource(operation: ChildOperation) -> str | None:
    if operation.state == "succeeded" and operation.resource_id:
        return operation.resource_id
    return None


def _found_in_local_record(success: ToolAttemptResult) -> ToolAttemptResult:
    return success.model_copy(update={"result": {**success.result, "found_by": "local_record"}})


def _inconclusive(
    operation: ChildOperation,
    reason: str,
    looked: dict[str, str],
    *,
    absent: bool = False,
    absent_after: timedelta | None = None,
) -> ToolAttemptResult:
    """A look-up that found nothing; ``absent``: by a consistent read that proves the
    effect does not exist (``absent_after``: an eventual read's lag)."""
    return ToolAttemptResult(
        outcome=OutcomeClass.UNKNOWN,
        reason=reason,
        evidence={**operation.evidence, **looked},
        miss_proves_absence=absent,
        miss_proves_absence_after=absent_after,
    )


def _not_configured(outcome: OutcomeClass = OutcomeClass.REJECTED) -> ToolAttemptResult:
    return ToolAttemptResult(
        outcome=outcome,
        reason="payments are not configured on this worker: set STRIPE_API_KEY",
    )


def _reply_ids(reply: ProviderReply) -> dict[str, str]:
    ids = {"request_id": reply.request_id, "original_request_id": reply.original_request_id}
    return {name: value for name, value in ids.items() if value}


def _answer_evidence(reply: ProviderReply) -> dict[str, str]:
    evidence = {"answered_at": _now()}
    if reply.replayed:
        evidence["replayed"] = "true"
    return evidence


def _failure_evidence(failure: PaymentProviderError) -> dict[str, str]:
    evidence = {"answered_at": _now()}
    if failure.http_status is not None:
        evidence["http_status"] = str(failure.http_status)
    if failure.code:
        evidence["provider_code"] = failure.code
    if failure.replayed:
        evidence["replayed"] = "true"
    if failure.http_status is None:
        evidence["response"] = "none: " + failure.reason
    return evidence


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
