"""The simulated Stripe account: its objects, its committed effects, every request.

An :class:`Account` holds PaymentIntents, charges and refunds, the *ledger* of effects
that really happened (a charge when a PaymentIntent reaches ``succeeded``, a refund when
one is created) and the *request log* of every API request received, faulted or not.

Every endpoint is split in two phases so the HTTP layer can apply Stripe's idempotency
rule "only requests that started executing are saved":

    prepare_*(params)  -> validates parameters; raises StripeApiError (nothing stored)
    commit(origin)     -> changes state and returns the object; may raise a stored error

A commit runs without awaiting, so it is atomic with respect to other requests.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Container
from dataclasses import asdict, dataclass, field

from ._wire import (
    CreatedRange,
    JsonObject,
    PageRequest,
    StripeApiError,
    invalid_request,
    new_id,
    param_amount,
    param_bool,
    param_created,
    param_expand,
    param_metadata,
    param_page,
    param_str,
    parse_search_query,
    resource_missing,
)

_TEST_PAYMENT_METHODS: dict[str, str | None] = {
    "pm_card_visa": None,
    "pm_card_mastercard": None,
    "pm_card_chargeDeclined": "generic_decline",
    "pm_card_chargeDeclinedInsufficientFunds": "insufficient_funds",
}
"""Stripe's test PaymentMethods: id -> decline code, or None when the charge succeeds."""

_REFUND_REASONS = frozenset({"duplicate", "fraudulent", "requested_by_customer"})
_SEARCHABLE_INTENT_FIELDS = frozenset({"status", "currency", "customer", "amount"})


@dataclass(frozen=True)
class EffectOrigin:
    """Which request committed an effect.

    Attributes:
        request_id: The ``Request-Id`` of the committing request.
        idempotency_key: Its ``Idempotency-Key`` header, or None when it had none.
    """

    request_id: str
    idempotency_key: str | None


Commit = Callable[[EffectOrigin], JsonObject]
"""Second phase of an endpoint: apply the change and return the response object."""


@dataclass(frozen=True)
class LedgerEntry:
    """One effect the provider committed: money moved.

    Attributes:
        kind: ``charge`` (a PaymentIntent succeeded) or ``refund``.
        object_id: The PaymentIntent id for a charge, the refund id for a refund.
        payment_intent: The PaymentIntent the money belongs to.
        charge: The charge id (``ch_...``).
        amount: Amount in the smallest currency unit.
        currency: Three-letter lowercase currency.
        idempotency_key: The key of the request that committed it (None if keyless).
        request_id: The request that committed it.
        metadata: The object's metadata at commit time.
        committed_at: Unix time of the commit.
    """

    kind: str
    object_id: str
    payment_intent: str
    charge: str
    amount: int
    currency: str
    idempotency_key: str | None
    request_id: str
    metadata: dict[str, str]
    committed_at: float

    def to_json(self) -> JsonObject:
        """Return the entry as a JSON object."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: JsonObject) -> LedgerEntry:
        """Rebuild an entry from :meth:`to_json` output."""
        return cls(**data)


@dataclass
class RequestRecord:
    """One API request as the provider saw it (control requests are not recorded).

    Attributes:
        request_id: The ``Request-Id`` assigned to it.
        method: HTTP method.
        path: Request path without the query string.
        idempotency_key: Its ``Idempotency-Key`` header, if any.
        received_at: Unix time it arrived.
        status: HTTP status answered; None while running or when no response was sent.
        outcome: ``executed`` | ``replayed`` | ``unauthenticated`` | ``invalid`` |
            ``idempotency_mismatch`` | ``key_in_use`` | ``faulted`` | ``in_progress``.
        fault: Name of the injected fault applied to it, if any.
    """

    request_id: str
    method: str
    path: str
    idempotency_key: str | None
    received_at: float
    status: int | None = None
    outcome: str = "in_progress"
    fault: str | None = None

    def to_json(self) -> JsonObject:
        """Return the record as a JSON object."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: JsonObject) -> RequestRecord:
        """Rebuild a record from :meth:`to_json` output."""
        return cls(**data)


@dataclass
class _Intent:
    body: JsonObject
    created_at: float


@dataclass
class Account:
    """A Stripe test-mode account with its ledger and request log.

    Attributes:
        ledger: Committed effects in commit order.
        requests: Every API request received, in arrival order.
        clock: Source of Unix time; replaceable in tests.
    """

    ledger: list[LedgerEntry] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    clock: Callable[[], float] = time.time
    _intents: dict[str, _Intent] = field(default_factory=dict)
    _charges: dict[str, JsonObject] = field(default_factory=dict)
    _refunds: dict[str, JsonObject] = field(default_factory=dict)

    def log_request(self, method: str, path: str, idempotency_key: str | None) -> RequestRecord:
        """Start a request-log record with a fresh request id and return it."""
        record = RequestRecord(new_id("req", 14), method, path, idempotency_key, self.clock())
        self.requests.append(record)
        return record

    # -- PaymentIntents ------------------------------------------------------------

    def prepare_create_intent(self, params: JsonObject) -> Commit:
        """Validate ``POST /v1/payment_intents``."""
        amount = param_amount(params)
        currency = (param_str(params, "currency", required=True) or "").lower()
        if len(currency) != 3 or not currency.isalpha():
            raise invalid_request(f"Invalid currency: {currency}", param="currency")
        payment_method = self._known_payment_method(param_str(params, "payment_method"))
        confirm = param_bool(params, "confirm")
        if confirm and payment_method is None:
            raise invalid_request(
                "You cannot confirm this PaymentIntent because it's missing a payment method.",
                param="payment_method",
                code="parameter_missing",
            )
        metadata, expand = param_metadata(params), param_expand(params)
        automatic = params.get("automatic_payment_methods")

        def commit(origin: EffectOrigin) -> JsonObject:
            now, intent_id = self.clock(), new_id("pi")
            body: JsonObject = {
                "id": intent_id,
                "object": "payment_intent",
                "amount": amount,
                "amount_capturable": 0,
                "amount_received": 0,
                "automatic_payment_methods": (
                    {"enabled": automatic.get("enabled") == "true"}
                    if isinstance(automatic, dict)
                    else None
                ),
                "canceled_at": None,
                "cancellation_reason": None,
                "capture_method": "automatic",
                "client_secret": f"{intent_id}_secret_{secrets.token_hex(12)}",
                "confirmation_method": "automatic",
                "created": int(now),
                "currency": currency,
                "customer": param_str(params, "customer"),
                "description": param_str(params, "description"),
                "last_payment_error": None,
                "latest_charge": None,
                "livemode": False,
                "metadata": metadata,
                "next_action": None,
                "payment_method": payment_method,
                "payment_method_types": ["card"],
                "receipt_email": param_str(params, "receipt_email"),
                "status": "requires_confirmation" if payment_method else "requires_payment_method",
            }
            intent = self._intents[intent_id] = _Intent(body, now)
            if confirm:
                self._confirm(intent, origin)
            return self._render_intent(intent.body, expand)

        return commit

    def prepare_confirm_intent(self, intent_id: str, params: JsonObject) -> Commit:
        """Validate ``POST /v1/payment_intents/{id}/confirm``."""
        intent = self._intent(intent_id)
        payment_method = self._known_payment_method(param_str(params, "payment_method"))
        expand = param_expand(params)

        def commit(origin: EffectOrigin) -> JsonObject:
            if intent.body["status"] not in ("requires_payment_method", "requires_confirmation"):
                raise invalid_request(
                    "You cannot confirm this PaymentIntent because it has a status of "
                    f"{intent.body['status']}.",
                    code="payment_intent_unexpected_state",
                )
            if payment_method is not None:
                intent.body["payment_method"] = payment_method
            self._confirm(intent, origin)
            return self._render_intent(intent.body, expand)

        return commit

    def prepare_retrieve_intent(self, intent_id: str, params: JsonObject) -> Commit:
        """Validate ``GET /v1/payment_intents/{id}``."""
        intent, expand = self._intent(intent_id), param_expand(params)
        return lambda origin: self._render_intent(intent.body, expand)

    def prepare_list_intents(self, params: JsonObject) -> Commit:
        """Validate ``GET /v1/payment_intents``: read-after-write, unlike search.

        Args:
            params: Query parameters: ``customer``, ``created[...]``, ``limit``,
                ``starting_after``, ``ending_before``, ``expand[]`` (``data.latest_charge``).
        """
        customer, created = param_str(params, "customer"), param_created(params)
        page = self._known_cursors(param_page(params), self._intents, "payment_intent")
        expand = [e.removeprefix("data.") for e in param_expand(params)]

        def keep(body: JsonObject) -> bool:
            return _created_in(created, body) and (customer is None or body["customer"] == customer)

        def commit(origin: EffectOrigin) -> JsonObject:
            bodies = [intent.body for intent in self._intents.values()]
            listing = _list_page(bodies, keep, page, "/v1/payment_intents")
            listing["data"] = [self._render_intent(body, expand) for body in listing["data"]]
            return listing

        return commit

    def prepare_search_intents(self, params: JsonObject, search_lag_seconds: float) -> Commit:
        """Validate ``GET /v1/payment_intents/search``.

        Args:
            params: Query parameters: ``query``, ``limit``, ``page``, ``expand[]``.
            search_lag_seconds: How long after creation an object becomes searchable.
        """
        query = parse_search_query(
            param_str(params, "query", required=True) or "", _SEARCHABLE_INTENT_FIELDS
        )
        limit = param_amount(params, "limit", required=False) or 10
        page_token = param_str(params, "page") or "0"
        if not page_token.isdigit():
            raise invalid_request(f"Invalid page: {page_token}", param="page")
        offset = int(page_token)
        expand = [e.removeprefix("data.") for e in param_expand(params)]

        def commit(origin: EffectOrigin) -> JsonObject:
            visible_before = self.clock() - search_lag_seconds
            hits = sorted(
                (i for i in self._intents.values() if i.created_at <= visible_before),
                key=lambda i: i.created_at,
                reverse=True,
            )
            hits = [i for i in hits if query.matches(i.body)]
            page = hits[offset : offset + min(limit, 100)]
            has_more = offset + len(page) < len(hits)
            return {
                "object": "search_result",
                "data": [self._render_intent(i.body, expand) for i in page],
                "has_more": has_more,
                "next_page": str(offset + len(page)) if has_more else None,
                "total_count": len(hits),
                "url": "/v1/payment_intents/search",
            }

        return commit

    def _confirm(self, intent: _Intent, origin: EffectOrigin) -> None:
        body = intent.body
        payment_method = body["payment_method"]
        if payment_method is None:
            raise invalid_request(
                "You cannot confirm this PaymentIntent because it's missing a payment method.",
                param="payment_method",
                code="payment_intent_unexpected_state",
            )
        decline_code = _TEST_PAYMENT_METHODS[payment_method]
        if decline_code is not None:
            error = StripeApiError(
                402,
                "card_error",
                "Your card was declined.",
                code="card_declined",
                decline_code=decline_code,
                extra={"payment_method": {"id": payment_method, "object": "payment_method"}},
            )
            body.update(
                status="requires_payment_method",
                payment_method=None,
                last_payment_error=error.body()["error"],
            )
            error.extra["payment_intent"] = dict(body)
            raise error
        now = self.clock()
        charge_id = new_id("ch")
        self._charges[charge_id] = {
            "id": charge_id,
            "object": "charge",
            "amount": body["amount"],
            "amount_captured": body["amount"],
            "amount_refunded": 0,
            "captured": True,
            "created": int(now),
            "currency": body["currency"],
            "customer": body["customer"],
            "livemode": False,
            "metadata": dict(body["metadata"]),
            "paid": True,
            "payment_intent": body["id"],
            "payment_method": payment_method,
            "refunded": False,
            "status": "succeeded",
        }
        body.update(
            status="succeeded",
            amount_received=body["amount"],
            latest_charge=charge_id,
            last_payment_error=None,
        )
        self._record_effect("charge", body["id"], body, charge_id, body["amount"], origin, now)

    def _render_intent(self, body: JsonObject, expand: list[str]) -> JsonObject:
        rendered = dict(body)
        if "latest_charge" in expand and body["latest_charge"] is not None:
            rendered["latest_charge"] = dict(self._charges[body["latest_charge"]])
        return rendered

    def _intent(self, intent_id: str, param: str = "id") -> _Intent:
        intent = self._intents.get(intent_id)
        if intent is None:
            raise resource_missing("payment_intent", intent_id, param)
        return intent

    @staticmethod
    def _known_cursors(page: PageRequest, ids: Container[str], kind: str) -> PageRequest:
        for param, cursor in (
            ("starting_after", page.starting_after),
            ("ending_before", page.ending_before),
        ):
            if cursor is not None and cursor not in ids:
                raise resource_missing(kind, cursor, param)
        return page

    @staticmethod
    def _known_payment_method(payment_method: str | None) -> str | None:
        if payment_method is not None and payment_method not in _TEST_PAYMENT_METHODS:
            raise resource_missing("PaymentMethod", payment_method, "payment_method")
        return payment_method

    def forget(self, object_id: str) -> list[str]:
        """Forget a PaymentIntent (with its charges and refunds) or a refund, as Stripe's
        "delete test data" forgets test objects: reads answer 404 and lists leave it
        out; the ledger keeps the effect, which did happen. Stripe's API has no delete
        for either, so this is for tests that need a resource gone from the provider.

        Returns:
            The ids forgotten (empty when the id is unknown).
        """
        if object_id in self._refunds:
            del self._refunds[object_id]
            return [object_id]
        intent = self._intents.pop(object_id, None)
        if intent is None:
            return []
        gone = [object_id]
        for charge_id, charge in list(self._charges.items()):
            if charge["payment_intent"] == object_id:
                gone.append(self._charges.pop(charge_id)["id"])
        for refund_id, refund in list(self._refunds.items()):
            if refund["payment_intent"] == object_id:
                gone.append(self._refunds.pop(refund_id)["id"])
        return gone

    # -- Refunds -------------------------------------------------------------------

    def prepare_create_refund(self, params: JsonObject) -> Commit:
        """Validate ``POST /v1/refunds`` (by ``payment_intent``)."""
        intent_id = param_str(params, "payment_intent", required=True) or ""
        intent = self._intent(intent_id, "payment_intent")
        requested = param_amount(params, required=False)
        reason = param_str(params, "reason")
        if reason is not None and reason not in _REFUND_REASONS:
            raise invalid_request(f"Invalid reason: {reason}", param="reason")
        metadata = param_metadata(params)

        def commit(origin: EffectOrigin) -> JsonObject:
            body = intent.body
            if body["status"] != "succeeded":
                raise invalid_request(
                    f"This PaymentIntent ({intent_id}) does not have a successful charge "
                    "to refund.",
                    param="payment_intent",
                    code="payment_intent_unexpected_state",
                )
            charge = self._charges[body["latest_charge"]]
            remaining = int(charge["amount"]) - int(charge["amount_refunded"])
            if remaining == 0:
                raise invalid_request(
                    f"Charge {charge['id']} has already been refunded.",
                    code="charge_already_refunded",
                )
            amount = remaining if requested is None else requested
            if amount > remaining:
                raise invalid_request(
                    f"Refund amount ({amount}) is greater than unrefunded amount on charge "
                    f"({remaining}).",
                    param="amount",
                    code="amount_too_large",
                )
            now, refund_id = self.clock(), new_id("re")
            charge["amount_refunded"] = int(charge["amount_refunded"]) + amount
            charge["refunded"] = charge["amount_refunded"] == charge["amount"]
            refund = self._refunds[refund_id] = {
                "id": refund_id,
                "object": "refund",
                "amount": amount,
                "balance_transaction": new_id("txn"),
                "charge": charge["id"],
                "created": int(now),
                "currency": body["currency"],
                "metadata": metadata,
                "payment_intent": intent_id,
                "reason": reason,
                "status": "succeeded",
            }
            self._record_effect("refund", refund_id, refund, charge["id"], amount, origin, now)
            return dict(refund)

        return commit

    def prepare_retrieve_refund(self, refund_id: str) -> Commit:
        """Validate ``GET /v1/refunds/{id}``."""
        refund = self._refunds.get(refund_id)
        if refund is None:
            raise resource_missing("refund", refund_id)
        return lambda origin: dict(refund)

    def prepare_list_refunds(self, params: JsonObject) -> Commit:
        """Validate ``GET /v1/refunds``.

        Args:
            params: Query parameters: ``payment_intent``, ``charge``, ``created[...]``,
                ``limit``, ``starting_after``, ``ending_before``.
        """
        payment_intent, charge = param_str(params, "payment_intent"), param_str(params, "charge")
        created = param_created(params)
        page = self._known_cursors(param_page(params), self._refunds, "refund")

        def keep(refund: JsonObject) -> bool:
            return (
                _created_in(created, refund)
                and (payment_intent is None or refund["payment_intent"] == payment_intent)
                and (charge is None or refund["charge"] == charge)
            )

        def commit(origin: EffectOrigin) -> JsonObject:
            listing = _list_page(list(self._refunds.values()), keep, page, "/v1/refunds")
            listing["data"] = [dict(refund) for refund in listing["data"]]
            return listing

        return commit

    def _record_effect(
        self,
        kind: str,
        object_id: str,
        body: JsonObject,
        charge_id: str,
        amount: int,
        origin: EffectOrigin,
        now: float,
    ) -> None:
        self.ledger.append(
            LedgerEntry(
                kind=kind,
                object_id=object_id,
                payment_intent=str(body.get("payment_intent") or body["id"]),
                charge=charge_id,
                amount=amount,
                currency=str(body["currency"]),
                idempotency_key=origin.idempotency_key,
                request_id=origin.request_id,
                metadata=dict(body["metadata"]),
                committed_at=now,
            )
        )


def _created_in(created: CreatedRange, obj: JsonObject) -> bool:
    return created.contains(int(obj["created"]))


def _list_page(
    in_creation_order: list[JsonObject],
    keep: Callable[[JsonObject], bool],
    page: PageRequest,
    url: str,
) -> JsonObject:
    """Cut one page of a list endpoint, as Stripe's cursor pagination does.

    Objects are ordered newest first (``created`` descending, later creation first on a
    tie); a cursor marks a place in that whole order, so it works even when the cursor
    object itself does not pass the filters.

    Args:
        in_creation_order: Every object of the kind, oldest first.
        keep: The request's filters.
        page: ``limit`` and at most one cursor, whose object exists.
        url: The list's path, echoed in the response.
    """
    # A stable sort of the reversed creation order breaks ``created`` ties newest first.
    newest_first = sorted(reversed(in_creation_order), key=lambda o: o["created"], reverse=True)
    ids = [obj["id"] for obj in newest_first]
    if page.ending_before is not None:
        # The newer objects nearest the cursor, still newest first: the previous page.
        newer = [o for o in newest_first[: ids.index(page.ending_before)] if keep(o)]
        data, has_more = newer[-page.limit :], len(newer) > page.limit
    else:
        start = 0 if page.starting_after is None else ids.index(page.starting_after) + 1
        older = [o for o in newest_first[start:] if keep(o)]
        data, has_more = older[: page.limit], len(older) > page.limit
    return {"object": "list", "url": url, "has_more": has_more, "data": data}
