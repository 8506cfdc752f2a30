"""What a payment attempt and a look-up both report: the child operations' names, the
states that mean money moved, and the results built from a provider's answer."""

from datetime import UTC, datetime

from onceflow.payments._contract import RefundPaymentInput
from onceflow.payments._provider import (
    PaymentIntentView,
    ProviderReply,
    RefundView,
)
from onceflow.tools import ChildOperation, OutcomeClass, ToolAttemptResult, ToolCall

CHARGE_CHILD_OP = "charge"
"""Child operation name of a charge in its derived key."""


REFUND_CHILD_OP = "refund"
"""Child operation name of a refund in its derived key."""


CHARGED = frozenset({"succeeded", "processing", "requires_capture"})
"""PaymentIntent statuses where the charge exists (money moved or is moving)."""


REFUNDED = frozenset({"succeeded", "pending", "requires_action"})
"""Refund statuses where the refund exists."""


async def charged_intent(
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


async def succeed_charge(
    operation: ChildOperation, intent: PaymentIntentView, found_by: str, attempt: dict[str, str]
) -> ToolAttemptResult:
    attempt.update(answer_evidence(intent.reply))
    ids = {"payment_intent": intent.id, **reply_ids(intent.reply)}
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


async def succeed_refund(
    operation: ChildOperation, refund: RefundView, found_by: str, attempt: dict[str, str]
) -> ToolAttemptResult:
    attempt.update(answer_evidence(refund.reply))
    ids = {"refund": refund.id, **reply_ids(refund.reply)}
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


def not_configured(outcome: OutcomeClass = OutcomeClass.REJECTED) -> ToolAttemptResult:
    return ToolAttemptResult(
        outcome=outcome,
        reason="payments are not configured on this worker: set STRIPE_API_KEY",
    )


def reply_ids(reply: ProviderReply) -> dict[str, str]:
    ids = {"request_id": reply.request_id, "original_request_id": reply.original_request_id}
    return {name: value for name, value in ids.items() if value}


def answer_evidence(reply: ProviderReply) -> dict[str, str]:
    evidence = {"answered_at": now_text()}
    if reply.replayed:
        evidence["replayed"] = "true"
    return evidence


def now_text() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
