"""ledgerpay's two onceflow tools, ``ledgerpay_charge`` and ``ledgerpay_refund``: a second
payment provider on the public tool API, with ledgerpay's idempotency rules, not Stripe's.

Each step sends one POST with the step's derived child key as ``Idempotency-Key`` and the
key's digest as the charge's (or refund's) ``reference``. What the service's rules
(``ledgerpay.service``) mean for the tools:

- keys kept one hour: the contracts declare that retention and a margin, so onceflow
  sends a key again only inside ``retention - margin`` of its first send; past it the
  step is looked up and, if nothing is found, parks;
- no stored 500s: a 500 is ``unknown`` (it may follow a commit, as far as a client can
  tell), but repeating it is worth the budget: the same key executes again, where
  Stripe would replay the stored 500;
- the look-up by reference is consistent: an attempt after the first reads it before
  sending, so a lost answer is found, never sent again, and a miss proves nothing was
  made; the look-up before a step parks proves absence by a miss, so an operator's
  ``did_not_happen`` is checked, not taken on trust.

One attempt::

    begin: record the key's first send (past the key's send-by: nothing sent, the
     │     workflow looks the step up, then parks)
     ├─ an earlier attempt succeeded ──▶ its result; nothing sent
     ├─ not the step's first attempt: GET ?reference= (every key generation's digest)
     │     ├─ found ──▶ succeeded, found_by "reference"; nothing sent
     │     └─ a miss, or the read failed ──▶ on (inside its window the key dedupes)
     └─ POST, Idempotency-Key = child key, reference = its digest
          2xx, fresh or replayed                      succeeded
          402 declined; 400, 404, 422 refused         rejected    the step fails
          409 key in flight; 429, 503                 transient   repeated later
          no connection made                          transient
          timeout or reset after sending; 500 …       unknown     repeated inside the
                                                                  window, else looked
                                                                  up, else parked

Registered by configuration (``ONCEFLOW_TOOLS=ledgerpay``, the entry point this package
declares, which calls ``ledgerpay_tools``); the settings are ``ledgerpay.settings``.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ledgerpay.settings import (
    LedgerpayClient,
    LedgerpaySettings,
    load_settings,
    open_ledgerpay_client,
)
from onceflow.tools import (
    ChildOperation,
    DedupeStrategy,
    EffectFlags,
    OutcomeClass,
    Tool,
    ToolAttemptResult,
    ToolCall,
    ToolContract,
    classify_http_error,
    classify_http_status,
)

_STEP_OR_ORDER = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"
_LARGEST_AMOUNT = 99_999_999


class ChargeInput(BaseModel):
    """Charge a customer's saved payment method once for an order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    amount: int = Field(strict=True, gt=0, le=_LARGEST_AMOUNT)
    """Amount in the currency's smallest unit (cents)."""
    currency: str = Field(pattern=r"^[a-z]{3}$")
    """Three-letter ISO currency code, lower case."""
    customer: str = Field(pattern=r"^cus_[A-Za-z0-9_]{1,64}$")
    """The ledgerpay customer (``cus_…``)."""
    payment_method: str = Field(pattern=r"^pm_[A-Za-z0-9_]{1,64}$")
    """The customer's saved payment method (``pm_…``)."""
    order_id: str = Field(pattern=_STEP_OR_ORDER)
    """The order being paid; the charge's description names it."""


class RefundInput(BaseModel):
    """Refund (part of) a charge: name the charge, or a charge step of this task."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    charge: str | None = Field(default=None, pattern=r"^ch_[A-Za-z0-9_]{1,64}$")
    """The charge to refund (``ch_…``)."""
    charge_step: str | None = Field(default=None, pattern=_STEP_OR_ORDER)
    """Instead of ``charge``: an earlier ``ledgerpay_charge`` step of the same task,
    whose charge onceflow recorded when that step succeeded."""
    amount: int | None = Field(default=None, strict=True, gt=0, le=_LARGEST_AMOUNT)
    """Minor units to refund. Default: what is left of the charge."""

    @model_validator(mode="after")
    def _names_one_charge(self) -> "RefundInput":
        if (self.charge is None) == (self.charge_step is None):
            raise ValueError("give exactly one of charge and charge_step")
        return self


@dataclass(frozen=True)
class _Kind:
    """What the two tools do alike, told apart: where their objects live at ledgerpay."""

    child_op: str
    """The child operation's name in the derived key."""
    path: str
    """``/charges`` or ``/refunds``: POST creates, GET ``?reference=`` finds."""
    noun: str
    """``charge`` or ``refund``: the correlation id the resource is recorded under."""


CHARGES = _Kind(child_op="charge", path="/charges", noun="charge")
REFUNDS = _Kind(child_op="refund", path="/refunds", noun="refund")

Mismatches = Callable[[Any, dict[str, Any]], list[str]]
"""``(arguments, found) -> problems``: how a resource differs from what the step asked."""


def ledgerpay_tools() -> tuple[Tool, Tool]:
    """Both tools under this process's settings: the ``onceflow.tools`` entry point
    ``ledgerpay`` names this function, and every process that loads it calls it once."""
    settings = load_settings()
    opener = partial(open_ledgerpay_client, settings)
    charge_contract = _contract(
        settings,
        name="ledgerpay_charge",
        description="Charge a customer's saved payment method at ledgerpay for an order; "
        "the same call in the same task charges at most once.",
        input_model=ChargeInput,
        # Not destructive: a charge moves money, it undoes nothing.
        destructive=False,
    )
    refund_contract = _contract(
        settings,
        name="ledgerpay_refund",
        description="Refund a ledgerpay charge, in full or in part; the same call in the "
        "same task refunds at most once.",
        input_model=RefundInput,
        destructive=True,
    )
    return (
        Tool(contract=charge_contract, perform=charge, look_up=look_up_charge, open_client=opener),
        Tool(contract=refund_contract, perform=refund, look_up=look_up_refund, open_client=opener),
    )


def _contract(
    settings: LedgerpaySettings,
    *,
    name: str,
    description: str,
    input_model: type[BaseModel],
    destructive: bool,
) -> ToolContract:
    return ToolContract(
        name=name,
        description=description,
        input_model=input_model,
        # Idempotent per step: every attempt of a step carries the same derived key, and
        # onceflow sends it only while ledgerpay still keeps it.
        effects=EffectFlags(idempotent=True, destructive=destructive, open_world=True),
        dedupe=DedupeStrategy.PROVIDER_IDEMPOTENCY_KEY,
        provider_key_retention=settings.key_retention,
        retention_margin=settings.retention_margin,
        provider_settle_time=settings.settle_time,
        start_to_close_timeout=settings.attempt_timeout,
        # An operator's "happened --resource-id" is read back and checked against the
        # step (its reference and arguments) before it is accepted.
        lookup_verifies_resource_ids=True,
    )


# ── perform ─────────────────────────────────────────────────────────────────────────


async def charge(call: ToolCall[ChargeInput]) -> ToolAttemptResult:
    """One attempt at the step's charge. The documented result is ledgerpay's charge
    (``id``, ``amount``, ``currency``, ``amount_refunded``, ``reference``, …) plus
    ``found_by``: ``response``, ``replay``, ``reference`` or ``lookup``."""
    client: LedgerpayClient = call.client
    operation = await call.begin(CHARGES.child_op, provider_account=client.account)
    if operation.earlier_success:
        return operation.earlier_success
    arguments = call.args
    body = {
        "amount": arguments.amount,
        "currency": arguments.currency,
        "customer": arguments.customer,
        "payment_method": arguments.payment_method,
        "description": f"order {arguments.order_id}",
        "reference": operation.key_digest,
    }
    return await _send(call, CHARGES, operation, body)


async def refund(call: ToolCall[RefundInput]) -> ToolAttemptResult:
    """One attempt at the step's refund. The documented result is ledgerpay's refund
    (``id``, ``charge``, ``amount``, ``currency``, ``reference``, …) plus ``found_by``."""
    client: LedgerpayClient = call.client
    operation = await call.begin(REFUNDS.child_op, provider_account=client.account)
    if operation.earlier_success:
        return operation.earlier_success
    arguments = call.args
    charge_id = arguments.charge
    if charge_id is None:
        charged = await call.find(
            CHARGES.child_op, provider_account=client.account, step_id=arguments.charge_step
        )
        charge_id = charged.resource_id if charged.state == "succeeded" else None
    if charge_id is None:
        reason = (
            f"step {arguments.charge_step!r} recorded no charge: it must be an earlier "
            "ledgerpay_charge step of this task that succeeded"
        )
        return await operation.failed(OutcomeClass.REJECTED, reason)
    body = {"charge": charge_id, "amount": arguments.amount, "reference": operation.key_digest}
    return await _send(call, REFUNDS, operation, body)


async def _send(
    call: ToolCall[Any], kind: _Kind, operation: ChildOperation, body: dict[str, Any]
) -> ToolAttemptResult:
    client: LedgerpayClient = call.client
    evidence: dict[str, str] = {}
    # The attempt number decides no key, only whether to read first: an earlier attempt
    # may have committed and lost its answer, and ledgerpay's read by reference is
    # consistent, so reading is cheaper than a repeat and a miss proves there is none.
    if call.attempt > 1:
        found = await _by_reference(client, kind, operation, evidence)
        if found is not None and len(found) == 1:
            return await _succeed(operation, kind, found[0], "reference", evidence)
        if found:  # a duplicate already: sending again could only add one
            reason = evidence["reference_read"]
            return await operation.failed(OutcomeClass.UNKNOWN, reason, evidence=evidence)
    try:
        response = await client.http.post(
            kind.path, json=body, headers={"Idempotency-Key": operation.key}
        )
    except httpx.HTTPError as error:
        outcome, reason = classify_http_error(error)
        return await operation.failed(outcome, reason, evidence=evidence)
    # Persisted with the outcome, for reconciliation: a replay names the original request.
    ids = {
        name: value
        for name, header in (("request_id", "Request-Id"), ("replayed_from", "Original-Request"))
        if (value := response.headers.get(header))
    }
    if response.is_success:
        how = "replay" if response.headers.get("Idempotent-Replayed") == "true" else "response"
        return await _succeed(operation, kind, response.json(), how, evidence, **ids)
    outcome, reason = classify_http_status(response.status_code)
    said = _error_of(response)
    if response.status_code >= 500:
        said += (
            "; ledgerpay keeps no failed request under its key, so a repeat executes "
            "afresh (the next attempt reads the reference first)"
        )
    return await operation.failed(outcome, f"{reason}: {said}", evidence=evidence, **ids)


async def _succeed(
    operation: ChildOperation,
    kind: _Kind,
    found: dict[str, Any],
    how: str,
    evidence: dict[str, str],
    **ids: str,
) -> ToolAttemptResult:
    resource = str(found["id"])
    return await operation.succeeded(
        resource,
        {**found, "found_by": how},
        evidence={**evidence, "found_by": how},
        **{kind.noun: resource},
        **ids,
    )


# ── look-ups ────────────────────────────────────────────────────────────────────────


async def look_up_charge(call: ToolCall[ChargeInput]) -> ToolAttemptResult:
    """Before the step parks, or to check an operator's decision: the step's charge by
    its reference. ``succeeded`` when found; a miss proves there is none."""
    return await _look_up(call, CHARGES, _charge_mismatches)


async def look_up_refund(call: ToolCall[RefundInput]) -> ToolAttemptResult:
    """The step's refund by its reference, as ``look_up_charge``."""
    return await _look_up(call, REFUNDS, _refund_mismatches)


async def _look_up(
    call: ToolCall[Any],
    kind: _Kind,
    mismatches: Mismatches,
) -> ToolAttemptResult:
    client: LedgerpayClient = call.client
    operation = await call.find(kind.child_op, provider_account=client.account)
    looked = {"lookup_at": _now()}
    if call.claimed_resource_id is not None:
        return await _verify_claimed(call, kind, operation, mismatches, looked)
    if operation.earlier_success:
        return operation.earlier_success
    found = await _by_reference(client, kind, operation, looked)
    if found is None or len(found) > 1:
        return _inconclusive(operation, looked["reference_read"], looked)
    if found:
        return await _succeed(operation, kind, found[0], "lookup", looked)
    # ledgerpay reads the ledger itself: a miss is proof, not a search index lagging.
    return _inconclusive(operation, looked["reference_read"], looked, absent=True)


def _charge_mismatches(arguments: ChargeInput, found: dict[str, Any]) -> list[str]:
    if (found.get("amount"), found.get("currency")) != (arguments.amount, arguments.currency):
        return [f"the step charges {arguments.amount} {arguments.currency}"]
    return []


def _refund_mismatches(arguments: RefundInput, found: dict[str, Any]) -> list[str]:
    problems = []
    if arguments.amount is not None and found.get("amount") != arguments.amount:
        problems.append(f"the step refunds {arguments.amount}")
    if arguments.charge is not None and found.get("charge") != arguments.charge:
        problems.append(f"the step refunds {arguments.charge}")
    return problems


async def _verify_claimed(
    call: ToolCall[Any],
    kind: _Kind,
    operation: ChildOperation,
    mismatches: Mismatches,
    looked: dict[str, str],
) -> ToolAttemptResult:
    """Check the resource an operator says the step made: it exists, carries one of the
    step's references, and matches its arguments. Recorded as the step's effect when it
    does (a refund by ``charge_step`` reads it), or when the operator accepts it
    unverified."""
    client: LedgerpayClient = call.client
    claimed = call.claimed_resource_id or ""
    found: dict[str, Any] | None = None
    try:
        response = await client.http.get(f"{kind.path}/{claimed}")
    except httpx.HTTPError as error:
        problems = [f"it could not be read ({type(error).__name__})"]
    else:
        if response.status_code == 200:
            found = response.json()
            problems = []
        else:
            problems = [f"reading it answered HTTP {response.status_code}"]
    if found is not None:
        if found.get("reference") not in operation.key_digests:
            problems.append(f"it is not this step's {kind.noun} (another reference)")
        problems += mismatches(call.args, found)
    looked["lookup_claimed"] = f"{kind.noun} {claimed}: " + ("; ".join(problems) or "matches")
    if problems and call.accept_unverified:
        result = {"id": claimed, "verified": False, "found_by": "operator:unverified"}
        return await operation.succeeded(claimed, result, evidence=looked, **{kind.noun: claimed})
    if problems or found is None:
        return _inconclusive(operation, looked["lookup_claimed"], looked)
    return await _succeed(operation, kind, found, "operator", looked)


async def _by_reference(
    client: LedgerpayClient, kind: _Kind, operation: ChildOperation, evidence: dict[str, str]
) -> list[dict[str, Any]] | None:
    """Every resource carrying a reference of the step (the digest of its key in each
    generation: an effect made under an earlier one is still the step's); None when a
    read failed. What the reads saw goes into ``evidence["reference_read"]``."""
    found: list[dict[str, Any]] = []
    for reference in operation.key_digests:
        try:
            response = await client.http.get(kind.path, params={"reference": reference})
        except httpx.HTTPError as error:
            evidence["reference_read"] = f"the read failed ({type(error).__name__})"
            return None
        if response.status_code != 200:
            evidence["reference_read"] = f"the read answered HTTP {response.status_code}"
            return None
        found += response.json().get(kind.path.strip("/"), [])
    ids = ", ".join(str(row["id"]) for row in found)
    if not found:
        evidence["reference_read"] = (
            f"no {kind.noun} carries this step's reference (ledgerpay's read is consistent: "
            "there is none)"
        )
    elif len(found) == 1:
        evidence["reference_read"] = f"found {ids}"
    else:
        evidence["reference_read"] = (
            f"{len(found)} {kind.noun}s carry this step's reference ({ids}): a duplicate, "
            "reconcile by hand"
        )
    return found


def _inconclusive(
    operation: ChildOperation, reason: str, looked: dict[str, str], *, absent: bool = False
) -> ToolAttemptResult:
    return ToolAttemptResult(
        outcome=OutcomeClass.UNKNOWN,
        reason=reason,
        evidence={**operation.evidence, **looked},
        miss_proves_absence=absent,
    )


def _error_of(response: httpx.Response) -> str:
    """ledgerpay's error type and detail (never a key or a body we sent)."""
    try:
        error = response.json().get("error") or {}
    except ValueError:
        return "no error document"
    return f"{error.get('type', 'error')} ({error.get('detail', '')})"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
