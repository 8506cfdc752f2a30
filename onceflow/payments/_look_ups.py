"""Looks ``charge_payment`` and ``refund_payment`` up at the provider before a step parks
(and finds an earlier charge or refund before one is sent again): the locally recorded
resource, a resource id an earlier attempt saw, then the list API matched by the operation
id in the metadata; Stripe's search only when the list cannot be read."""

from dataclasses import dataclass
from datetime import timedelta

from onceflow.payments._contract import ChargePaymentInput, RefundPaymentInput
from onceflow.payments._errors import PaymentProviderError
from onceflow.payments._outcomes import (
    CHARGE_CHILD_OP,
    CHARGED,
    REFUND_CHILD_OP,
    REFUNDED,
    charged_intent,
    not_configured,
    now_text,
    succeed_charge,
    succeed_refund,
)
from onceflow.payments._provider import (
    OPERATION_METADATA_KEY,
    PaymentIntentView,
    PaymentProvider,
    RefundView,
)
from onceflow.tools import ChildOperation, NothingSent, OutcomeClass, ToolAttemptResult, ToolCall

CLOCK_MARGIN = timedelta(minutes=10)
"""How far a list look-up reaches before the key's first send (onceflow's database
clock) for the provider's creation time of the charge (its own clock)."""


SEARCH_LAG = timedelta(hours=1)
"""How long after the key's last attempt a miss in Stripe's search proves absence: data
is searchable within a minute normally, and up to an hour during an outage."""


async def look_up_charge(call: ToolCall[ChargePaymentInput]) -> ToolAttemptResult:
    """Find the step's charge: by a known PaymentIntent id, else in its customer's list.

    Returns ``succeeded`` with the PaymentIntent when found, else ``unknown`` with
    what each read answered (inconclusive: the step parks).
    """
    provider: PaymentProvider | None = call.client
    if provider is None:
        return not_configured(OutcomeClass.UNKNOWN)
    operation = await call.find(CHARGE_CHILD_OP, provider_account=provider.account)
    looked = {"lookup_at": now_text()}
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
                return await succeed_charge(operation, intent, "lookup:retrieve", looked)
            reason = (
                f"PaymentIntent {intent.id} (this step's key) is {intent.status}: no money "
                "moved on it"
            )
            # A consistent read; an earlier key generation's charge would be another one.
            return _inconclusive(operation, reason, looked, absent=operation.generation == 1)
    search = await find_charge(provider, operation, call.args.customer, looked)
    if search.found is not None:
        return await succeed_charge(operation, search.found, search.how, looked)
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
    return await succeed_charge(operation, intent, "lookup:operator", looked)


async def find_charge(
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


async def find_refund(
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
        return not_configured(OutcomeClass.UNKNOWN)
    operation = await call.find(REFUND_CHILD_OP, provider_account=provider.account)
    looked = {"lookup_at": now_text()}
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
            return await succeed_refund(operation, refund, "lookup:retrieve", looked)
    arguments = call.args
    try:
        payment_intent = arguments.payment_intent or await charged_intent(
            call, arguments.charge_step or "", provider.account
        )
    except NothingSent:
        payment_intent = None
    if payment_intent is None:
        reason = "the refunded PaymentIntent is not known: nothing to list the refunds of"
        return _inconclusive(operation, reason, looked)
    found = await find_refund(provider, operation, payment_intent, looked)
    if found is not None:
        return await succeed_refund(operation, found, "lookup:list", looked)
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
    return await succeed_refund(operation, refund, "lookup:operator", looked)


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


def _operation_ids(operation: ChildOperation) -> str:
    return "this step's operation id is " + " or ".join(operation.key_digests)


async def _record_unverified(
    operation: ChildOperation, kind: str, claimed: str, looked: dict[str, str]
) -> ToolAttemptResult:
    """Record the resource an operator accepted unverified as the step's effect."""
    result = {kind: claimed, "verified": False, "found_by": "operator:unverified"}
    return await operation.succeeded(claimed, result, evidence=looked, **{kind: claimed})


def _recorded_resource(operation: ChildOperation) -> str | None:
    if operation.state == "succeeded" and operation.resource_id:
        return operation.resource_id
    return None
