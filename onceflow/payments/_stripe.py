"""The ``PaymentProvider`` for Stripe, over one ``StripeClient`` with its retries off.

The client is built once per worker with ``max_network_retries=0`` (the workflow's budget
is the only retry owner; the SDK's own retries would also repeat 409s) and explicit
httpx timeouts. Every POST carries the caller's idempotency key; the SDK would otherwise
invent a random one per call, which dedupes nothing.
"""

import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any, NoReturn

import httpx
import stripe
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from onceflow.payments._errors import (
    PaymentProviderError,
    classify_stripe_error,
    is_replay,
    retry_after,
    stripe_error_code,
)
from onceflow.payments._provider import (
    LIST_LIMIT,
    OPERATION_METADATA_KEY,
    ChargeRequest,
    PaymentIntentView,
    ProviderReply,
    RefundRequest,
    RefundView,
)
from onceflow.payments._settings import StripeSettings
from onceflow.retry_policy import OutcomeClass
from onceflow.telemetry import outbound_call

_log = logging.getLogger(__name__)

_SEARCHABLE_OPERATION_ID = re.compile(r"^[A-Za-z0-9:_.-]{1,128}$")
_PAGE = 100
"""Objects per list page: Stripe's largest."""


def build_stripe_client(settings: StripeSettings) -> stripe.StripeClient:
    """One ``StripeClient`` with network retries off and explicit timeouts.

    Raises:
        ValueError: ``settings`` has no API key.
    """
    if settings.api_key is None or not settings.configured:
        raise ValueError("STRIPE_API_KEY is not set")
    timeout = httpx.Timeout(
        settings.request_timeout.total_seconds(),
        connect=settings.connect_timeout.total_seconds(),
    )
    return stripe.StripeClient(
        settings.api_key.get_secret_value(),
        base_addresses={"api": settings.api_base} if settings.api_base else None,
        max_network_retries=0,
        http_client=stripe.HTTPXClient(timeout=timeout),
    )


def _http_client_of(client: stripe.StripeClient) -> stripe.HTTPClient | None:
    # The SDK exposes no public accessor; closing its connections needs the HTTP client.
    http_client: stripe.HTTPClient | None = client._requestor._client
    return http_client


class StripePaymentProvider:
    """Stripe PaymentIntents and Refunds behind the ``PaymentProvider`` protocol."""

    def __init__(
        self, client: stripe.StripeClient, *, account: str, request_timeout: timedelta
    ) -> None:
        self.client = client
        """The underlying SDK client, public so the worker's retry check sees its settings
        (and for tests and diagnostics)."""
        self._account = account
        self._request_timeout = request_timeout

    @classmethod
    def from_settings(cls, settings: StripeSettings) -> "StripePaymentProvider":
        """A provider with a client built by ``build_stripe_client``."""
        return cls(
            build_stripe_client(settings),
            account=settings.account,
            request_timeout=settings.longest_call,
        )

    @property
    def account(self) -> str:
        """The Stripe account child keys are scoped to."""
        return self._account

    @property
    def request_timeout(self) -> timedelta:
        """The longest one call can take."""
        return self._request_timeout

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        http_client = _http_client_of(self.client)
        if http_client is not None:
            await http_client.close_async()  # type: ignore[no-untyped-call]  # untyped in the SDK

    async def create_payment_intent(
        self, request: ChargeRequest, *, idempotency_key: str
    ) -> PaymentIntentView:
        """Create and confirm a PaymentIntent (one POST) under ``idempotency_key``."""
        with outbound_call(
            "stripe", "POST /v1/payment_intents", _operation_attributes(request.metadata)
        ) as span:
            try:
                intent = await self._create_payment_intent(request, idempotency_key)
            except Exception as error:  # every failure leaves here classified
                _raise_classified(error, span)
            view = _intent_view(intent)
            _annotate(span, view.reply, {"stripe.payment_intent": view.id})
            return view

    async def _create_payment_intent(
        self, request: ChargeRequest, idempotency_key: str
    ) -> stripe.PaymentIntent:
        return await self.client.v1.payment_intents.create_async(
            params={
                "amount": request.amount,
                "currency": request.currency,
                "customer": request.customer,
                "payment_method": request.payment_method,
                "confirm": True,
                # Confirming server-side must never wait for a browser redirect.
                "automatic_payment_methods": {"enabled": True, "allow_redirects": "never"},
                "description": request.description,
                "metadata": dict(request.metadata),
            },
            options={"idempotency_key": idempotency_key},
        )

    async def retrieve_payment_intent(
        self, payment_intent_id: str, *, with_charge: bool = False
    ) -> PaymentIntentView:
        """Read a PaymentIntent by id, optionally with its latest charge."""
        with outbound_call(
            "stripe", "GET /v1/payment_intents/{id}", {"stripe.payment_intent": payment_intent_id}
        ) as span:
            try:
                intent = await self.client.v1.payment_intents.retrieve_async(
                    payment_intent_id,
                    params={"expand": ["latest_charge"]} if with_charge else None,
                )
            except Exception as error:
                _raise_classified(error, span)
            view = _intent_view(intent)
            _annotate(span, view.reply, {"stripe.payment_intent_status": view.status})
            return view

    async def search_payment_intents(self, operation_id: str) -> list[PaymentIntentView]:
        """PaymentIntents whose metadata names ``operation_id``; a miss proves nothing."""
        if not _SEARCHABLE_OPERATION_ID.fullmatch(operation_id):
            raise ValueError("an operation id holds only letters, digits and : _ . -")
        query = f"metadata['{OPERATION_METADATA_KEY}']:'{operation_id}'"
        with outbound_call(
            "stripe", "GET /v1/payment_intents/search", {"onceflow.child_key_digest": operation_id}
        ) as span:
            try:
                found = await self.client.v1.payment_intents.search_async(
                    params={"query": query, "limit": 10}
                )
            except Exception as error:
                _raise_classified(error, span)
            views = [_intent_view(intent, reply_from=found) for intent in found.data]
            span.set_attribute("stripe.found", [view.id for view in views])
            return views

    async def list_payment_intents(
        self, *, customer: str, created_from: datetime | None = None
    ) -> list[PaymentIntentView]:
        """``customer``'s PaymentIntents since ``created_from``, every page (the list
        API: read-after-write consistent, unlike search)."""
        params: dict[str, Any] = {"customer": customer, "limit": _PAGE}
        if created_from is not None:
            params["created"] = {"gte": int(created_from.timestamp())}
        with outbound_call("stripe", "GET /v1/payment_intents", {}) as span:
            pages = await self._all_pages(self.client.v1.payment_intents.list_async, params, span)
            views = [
                _intent_view(intent, reply_from=page) for page in pages for intent in page.data
            ]
            span.set_attribute("stripe.listed", len(views))
            return views

    async def list_refunds(self, payment_intent: str) -> list[RefundView]:
        """Every refund of ``payment_intent`` (the list API: read-after-write consistent)."""
        params: dict[str, Any] = {"payment_intent": payment_intent, "limit": _PAGE}
        with outbound_call(
            "stripe", "GET /v1/refunds", {"stripe.payment_intent": payment_intent}
        ) as span:
            pages = await self._all_pages(self.client.v1.refunds.list_async, params, span)
            views = [
                _refund_view(refund, reply_from=page) for page in pages for refund in page.data
            ]
            span.set_attribute("stripe.listed", len(views))
            return views

    async def payment_intent_pages(
        self, *, created_from: datetime, created_before: datetime
    ) -> AsyncIterator[list[PaymentIntentView]]:
        """Every PaymentIntent created in ``[created_from, created_before)`` (whole seconds,
        widened outwards), one page per request, newest first, with no upper bound: the
        list API (read-after-write consistent), for an audit."""
        async for page in self._pages_created(
            self.client.v1.payment_intents.list_async,
            "GET /v1/payment_intents",
            created_from,
            created_before,
        ):
            yield [_intent_view(intent, reply_from=page) for intent in page.data]

    async def refund_pages(
        self, *, created_from: datetime, created_before: datetime
    ) -> AsyncIterator[list[RefundView]]:
        """Every refund created in ``[created_from, created_before)``, like
        ``payment_intent_pages``."""
        async for page in self._pages_created(
            self.client.v1.refunds.list_async, "GET /v1/refunds", created_from, created_before
        ):
            yield [_refund_view(refund, reply_from=page) for refund in page.data]

    async def _pages_created(
        self,
        list_page: Callable[..., Awaitable[Any]],
        route: str,
        created_from: datetime,
        created_before: datetime,
    ) -> AsyncIterator[Any]:
        # Stripe's ``created`` is whole seconds: widen the window to them, never narrow it.
        params: dict[str, Any] = {
            "created": {
                "gte": math.floor(created_from.timestamp()),
                "lt": math.ceil(created_before.timestamp()),
            },
            "limit": _PAGE,
        }
        while True:
            with outbound_call("stripe", route, {}) as span:
                try:
                    page = await list_page(params=params)
                except Exception as error:
                    _raise_classified(error, span)
                span.set_attribute("stripe.listed", len(page.data))
            yield page
            if not page.has_more or not page.data:
                return
            params = {**params, "starting_after": page.data[-1].id}

    async def _all_pages(
        self, list_page: Callable[..., Awaitable[Any]], params: dict[str, Any], span: Span
    ) -> list[Any]:
        """Every page of a list, one request each, newest first; at most ``LIST_LIMIT``
        objects, past which a look-up could miss what it looks for."""
        pages: list[Any] = []
        while True:
            try:
                page = await list_page(params=params)
            except Exception as error:
                _raise_classified(error, span)
            pages.append(page)
            if not page.has_more or not page.data:
                return pages
            if len(pages) * _PAGE >= LIST_LIMIT:
                raise PaymentProviderError(
                    OutcomeClass.UNKNOWN,
                    f"more than {LIST_LIMIT} objects to list: the look-up stops short of proof",
                )
            params = {**params, "starting_after": page.data[-1].id}

    async def create_refund(self, request: RefundRequest, *, idempotency_key: str) -> RefundView:
        """Create a refund (one POST) under ``idempotency_key``."""
        params: stripe.params.RefundCreateParams = {
            "payment_intent": request.payment_intent,
            "metadata": dict(request.metadata),
        }
        if request.amount is not None:
            params["amount"] = request.amount
        if request.reason is not None:
            params["reason"] = request.reason
        with outbound_call(
            "stripe",
            "POST /v1/refunds",
            {
                **_operation_attributes(request.metadata),
                "stripe.payment_intent": request.payment_intent,
            },
        ) as span:
            try:
                refund = await self.client.v1.refunds.create_async(
                    params=params, options={"idempotency_key": idempotency_key}
                )
            except Exception as error:
                _raise_classified(error, span)
            view = _refund_view(refund)
            _annotate(span, view.reply, {"stripe.refund": view.id})
            return view

    async def retrieve_refund(self, refund_id: str) -> RefundView:
        """Read a refund by id."""
        with outbound_call("stripe", "GET /v1/refunds/{id}", {"stripe.refund": refund_id}) as span:
            try:
                refund = await self.client.v1.refunds.retrieve_async(refund_id)
            except Exception as error:
                _raise_classified(error, span)
            view = _refund_view(refund)
            _annotate(span, view.reply, {"stripe.refund_status": view.status})
            return view


@asynccontextmanager
async def open_stripe_provider(
    settings: StripeSettings,
) -> AsyncIterator[StripePaymentProvider | None]:
    """The worker's Stripe provider for the block's duration; None when no key is set."""
    if not settings.configured:
        _log.warning("STRIPE_API_KEY is not set: payment tools will reject every call")
        yield None
        return
    provider = StripePaymentProvider.from_settings(settings)
    try:
        yield provider
    finally:
        await provider.aclose()


def _raise_classified(error: Exception, span: Span) -> NoReturn:
    outcome, reason = classify_stripe_error(error)
    span.set_attribute("onceflow.outcome", outcome.value)
    if not isinstance(error, stripe.StripeError):
        raise PaymentProviderError(outcome, reason) from error
    classified = PaymentProviderError(
        outcome,
        reason,
        request_id=error.request_id,
        http_status=error.http_status,
        code=stripe_error_code(error),
        replayed=is_replay(error),
        payment_intent=_named_payment_intent(error),
        retry_after=retry_after(error.headers) if error.http_status == 429 else None,
    )
    span.set_attributes(
        {
            name: value
            for name, value in {
                "stripe.request_id": classified.request_id,
                "http.response.status_code": classified.http_status,
                "stripe.error_code": classified.code,
                "stripe.idempotent_replayed": classified.replayed,
                "stripe.payment_intent": classified.payment_intent,
            }.items()
            if value is not None
        }
    )
    raise classified from error


def _operation_attributes(metadata: dict[str, str]) -> dict[str, AttributeValue]:
    """The child key's digest (the operation id in the metadata), never the key itself."""
    operation = metadata.get(OPERATION_METADATA_KEY)
    return {"onceflow.child_key_digest": operation} if operation else {}


def _annotate(span: Span, reply: ProviderReply, ids: dict[str, AttributeValue]) -> None:
    span.set_attributes(ids)
    span.set_attribute("stripe.idempotent_replayed", reply.replayed)
    if reply.request_id:
        span.set_attribute("stripe.request_id", reply.request_id)
    if reply.original_request_id:
        span.set_attribute("stripe.original_request_id", reply.original_request_id)


def _named_payment_intent(error: stripe.StripeError) -> str | None:
    # A declined confirmation leaves a PaymentIntent behind and names it in the error.
    body: Any = error.json_body
    if isinstance(body, dict):
        intent = (body.get("error") or {}).get("payment_intent")
        if isinstance(intent, dict) and isinstance(intent.get("id"), str):
            return str(intent["id"])
    return None


def _reply(obj: stripe.StripeObject) -> ProviderReply:
    response = obj.last_response
    if response is None:
        return ProviderReply(request_id=None)
    replayed = response.headers.get("idempotent-replayed") == "true"
    return ProviderReply(
        request_id=response.request_id,
        replayed=replayed,
        original_request_id=response.headers.get("original-request") if replayed else None,
    )


def _metadata(metadata: Any) -> dict[str, str]:
    values = metadata.to_dict() if metadata is not None else {}
    return {str(key): str(value) for key, value in values.items()}


def _intent_view(
    intent: stripe.PaymentIntent, *, reply_from: stripe.StripeObject | None = None
) -> PaymentIntentView:
    latest = intent.latest_charge
    return PaymentIntentView(
        id=intent.id,
        status=str(intent.status),
        amount=intent.amount,
        currency=intent.currency,
        latest_charge=latest if isinstance(latest, str) or latest is None else latest.id,
        amount_refunded=latest.amount_refunded if isinstance(latest, stripe.Charge) else None,
        metadata=_metadata(intent.metadata),
        created=intent.created,
        reply=_reply(reply_from if reply_from is not None else intent),
    )


def _refund_view(
    refund: stripe.Refund, *, reply_from: stripe.StripeObject | None = None
) -> RefundView:
    intent = refund.payment_intent
    return RefundView(
        id=refund.id,
        status=str(refund.status),
        amount=refund.amount,
        currency=refund.currency,
        payment_intent=intent if isinstance(intent, str) or intent is None else intent.id,
        metadata=_metadata(refund.metadata),
        created=refund.created,
        reply=_reply(reply_from if reply_from is not None else refund),
    )
