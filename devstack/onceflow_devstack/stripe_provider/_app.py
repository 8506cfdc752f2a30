"""The aiohttp application: Stripe's API pipeline and the ``/_test`` control API.

Every ``/v1`` request goes through one pipeline, in the order Stripe applies its rules::

    log request -> fault: reset? -> authenticate -> fault: 429/503? -> decode params
      -> claim (api key, Idempotency-Key)  [POST with a key only]
           replay | 400 idempotency_error | 409 idempotency_key_in_use
      -> [fault: 500 before executing (releases the key)]
      -> validate (failure releases the key: nothing started executing)
      -> [fault: 500 before commit | delay before commit] -> commit
      -> [fault: 500 after commit] -> store response under the key
      -> [fault: drop | delay after commit] -> respond

The control API under ``/_test`` (JSON, no auth) edits faults and configuration, reads
the ledger and the request log, and forgets an object (``/_test/forget``, as Stripe's
"delete test data" does); it is never logged or faulted.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import asdict, dataclass, field, replace

from aiohttp import web

from ._faults import Fault, FaultPlan, FaultRule
from ._idempotency import ClaimOutcome, IdempotencyStore, Scope, StoredResponse
from ._ledger import Account, Commit, EffectOrigin, RequestRecord
from ._wire import (
    JsonObject,
    StripeApiError,
    decode_form,
    fingerprint_request,
    invalid_request,
)

_log = logging.getLogger(__name__)

_MAX_IDEMPOTENCY_KEY_LENGTH = 255


@dataclass(frozen=True)
class ProviderConfig:
    """Settings of one provider instance.

    Attributes:
        key_retention_seconds: How long an idempotency key is honoured after its first
            request; afterwards the same key is a brand-new request. Default ``86400.0``
            (Stripe keeps keys about 24 hours).
        search_lag_seconds: How long after creation an object appears in search results
            (Stripe's search is eventually consistent). Default ``0.0``.
        api_keys: The accepted secret keys; None accepts any ``sk_test_...`` key, each
            one its own account for idempotency. Default ``None``.
    """

    key_retention_seconds: float = 86400.0
    search_lag_seconds: float = 0.0
    api_keys: frozenset[str] | None = field(default=None)


class Provider:
    """All state of one provider: account, idempotency keys, faults, configuration."""

    def __init__(self, config: ProviderConfig) -> None:
        """Start empty with ``config``, which :meth:`reset` also restores."""
        self._initial_config = config
        self.config = config
        self.account = Account()
        self.keys = IdempotencyStore(config.key_retention_seconds)
        self.faults = FaultPlan()

    def configure(
        self, *, key_retention_seconds: float | None = None, search_lag_seconds: float | None = None
    ) -> None:
        """Change settings at run time; None leaves a setting unchanged."""
        if key_retention_seconds is not None:
            self.config = replace(self.config, key_retention_seconds=key_retention_seconds)
            self.keys.retention_seconds = key_retention_seconds
        if search_lag_seconds is not None:
            self.config = replace(self.config, search_lag_seconds=search_lag_seconds)

    def reset(self) -> None:
        """Forget objects, ledger, requests, keys and faults; restore the initial config."""
        self.config = self._initial_config
        self.account = Account()
        self.keys.clear()
        self.keys.retention_seconds = self.config.key_retention_seconds
        self.faults.clear()

    def authenticate(self, authorization: str | None) -> str:
        """Return the secret key from a Bearer or Basic (``curl -u sk_test_...:``) header.

        Raises:
            StripeApiError: 401 ``authentication_error`` for a missing or unknown key.
        """
        if authorization and authorization.startswith("Basic "):
            with suppress(ValueError):
                user = base64.b64decode(authorization.removeprefix("Basic ")).decode()
                authorization = "Bearer " + user.partition(":")[0]
        if not authorization or not authorization.startswith("Bearer "):
            raise StripeApiError(
                401,
                "authentication_error",
                "You did not provide an API key. You need to provide your API key in the "
                "Authorization header, using Bearer auth "
                "(e.g. 'Authorization: Bearer YOUR_SECRET_KEY').",
            )
        api_key = authorization.removeprefix("Bearer ").strip()
        accepted = self.config.api_keys
        if (accepted is not None and api_key not in accepted) or (
            accepted is None and (not api_key.startswith("sk_test_") or len(api_key) < 12)
        ):
            raise StripeApiError(
                401, "authentication_error", f"Invalid API Key provided: {api_key[:8]}****"
            )
        return api_key


PROVIDER = web.AppKey("provider", Provider)
"""Where the :class:`Provider` lives in the application, for in-process access."""

_Prepare = Callable[[Provider, web.Request, JsonObject], Commit]


def build_provider_app(config: ProviderConfig | None = None) -> web.Application:
    """Build the provider's aiohttp application.

    Args:
        config: Settings; defaults to :class:`ProviderConfig` defaults.

    Returns:
        The application; its :class:`Provider` is at ``app[PROVIDER]``.
    """
    app = web.Application()
    app[PROVIDER] = Provider(config or ProviderConfig())
    api: list[tuple[str, str, _Prepare]] = [
        ("POST", "/v1/payment_intents", lambda p, r, q: p.account.prepare_create_intent(q)),
        ("GET", "/v1/payment_intents", lambda p, r, q: p.account.prepare_list_intents(q)),
        (
            "GET",
            "/v1/payment_intents/search",
            lambda p, r, q: p.account.prepare_search_intents(q, p.config.search_lag_seconds),
        ),
        (
            "GET",
            "/v1/payment_intents/{id}",
            lambda p, r, q: p.account.prepare_retrieve_intent(r.match_info["id"], q),
        ),
        (
            "POST",
            "/v1/payment_intents/{id}/confirm",
            lambda p, r, q: p.account.prepare_confirm_intent(r.match_info["id"], q),
        ),
        ("POST", "/v1/refunds", lambda p, r, q: p.account.prepare_create_refund(q)),
        ("GET", "/v1/refunds", lambda p, r, q: p.account.prepare_list_refunds(q)),
        (
            "GET",
            "/v1/refunds/{id}",
            lambda p, r, q: p.account.prepare_retrieve_refund(r.match_info["id"]),
        ),
        ("*", "/v1/{tail:.*}", _unrecognized_url),
    ]
    for method, path, prepare in api:
        app.router.add_route(method, path, functools.partial(_handle_api, prepare=prepare))
    control: list[tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]] = [
        ("POST", "/_test/faults", _add_fault),
        ("GET", "/_test/faults", _list_faults),
        ("DELETE", "/_test/faults", _clear_faults),
        ("GET", "/_test/ledger", _ledger),
        ("GET", "/_test/requests", _requests),
        ("POST", "/_test/reset", _reset),
        ("POST", "/_test/forget", _forget),
        ("GET", "/_test/config", _config),
        ("POST", "/_test/config", _configure),
    ]
    for method, path, handler in control:
        app.router.add_route(method, path, handler)
    return app


def _unrecognized_url(provider: Provider, request: web.Request, params: JsonObject) -> Commit:
    raise invalid_request(
        f"Unrecognized request URL ({request.method}: {request.path}).", status=404
    )


async def _handle_api(request: web.Request, *, prepare: _Prepare) -> web.StreamResponse:
    provider = request.app[PROVIDER]
    key = request.headers.get("Idempotency-Key")
    record = provider.account.log_request(request.method, request.path, key)
    raw = await request.text() if request.method == "POST" else request.query_string
    rule = provider.faults.take(request.method, request.path)
    fault = rule.fault if rule is not None else None
    record.fault = fault.value if fault is not None else None
    if fault is Fault.RESET_BEFORE_COMMIT:
        return _hang_up(request, record, reset=True)
    try:
        api_key = provider.authenticate(request.headers.get("Authorization"))
    except StripeApiError as error:
        return _error_response(record, "unauthenticated", error, key)
    if fault is Fault.RATE_LIMIT_429:
        return _error_response(record, "faulted", _rate_limited(), key)
    if fault is Fault.ERROR_503:
        return _error_response(record, "faulted", _server_error(503), key)
    try:
        params = decode_form(raw)
        if key is not None and not 0 < len(key) <= _MAX_IDEMPOTENCY_KEY_LENGTH:
            raise invalid_request(
                f"Idempotency-Key must be 1 to {_MAX_IDEMPOTENCY_KEY_LENGTH} characters.",
                param="Idempotency-Key",
            )
    except StripeApiError as error:
        return _error_response(record, "invalid", error, key)

    scope: Scope | None = (api_key, key) if key is not None and request.method == "POST" else None
    if scope is not None:
        claim = await provider.keys.claim(
            scope, fingerprint_request(request.method, request.path, params), record.received_at
        )
        if claim.outcome is ClaimOutcome.REPLAY and claim.stored is not None:
            record.status, record.outcome = claim.stored.status, "replayed"
            headers = {"Idempotent-Replayed": "true", "Original-Request": claim.stored.request_id}
            return _response(record, claim.stored.status, claim.stored.body, key, headers)
        if claim.outcome is ClaimOutcome.MISMATCH:
            return _error_response(record, "idempotency_mismatch", _key_reused(key), key)
        if claim.outcome is ClaimOutcome.IN_FLIGHT:
            return _error_response(record, "key_in_use", _key_in_use(), key)

    if fault is Fault.ERROR_500_BEFORE_EXECUTING:
        # Stripe stores a result only once the endpoint began executing: a retry with the
        # same key runs afresh.
        if scope is not None:
            provider.keys.release(scope)
        return _error_response(record, "faulted", _server_error(500), key)

    try:
        commit = prepare(provider, request, params)
    except StripeApiError as error:
        if scope is not None:
            provider.keys.release(scope)
        return _error_response(record, "invalid", error, key)

    if fault is Fault.ERROR_500_BEFORE_COMMIT:
        status, body, record.outcome = 500, _server_error(500).body(), "faulted"
    else:
        if fault is Fault.DELAY_BEFORE_COMMIT and rule is not None:
            await asyncio.sleep(rule.delay_seconds)
        status, body = _run_commit(commit, EffectOrigin(record.request_id, key))
        record.outcome = "executed"
        if fault is Fault.ERROR_500_AFTER_COMMIT:
            status, body = 500, _server_error(500).body()
    payload = json.dumps(body, indent=2).encode()
    if scope is not None:
        provider.keys.complete(scope, StoredResponse(status, payload, record.request_id))
    if fault is Fault.DROP_AFTER_COMMIT:
        return _hang_up(request, record, reset=False)
    if fault is Fault.DELAY_AFTER_COMMIT and rule is not None:
        await asyncio.sleep(rule.delay_seconds)
    record.status = status
    return _response(record, status, payload, key)


def _run_commit(commit: Commit, origin: EffectOrigin) -> tuple[int, JsonObject]:
    try:
        return 200, commit(origin)
    except StripeApiError as error:
        return error.status, error.body()
    except Exception:
        # Stripe answers (and stores under the key) a 500 when execution breaks midway.
        _log.exception("provider commit failed for request %s", origin.request_id)
        return 500, _server_error(500).body()


def _hang_up(request: web.Request, record: RequestRecord, *, reset: bool) -> web.StreamResponse:
    transport = request.transport
    if transport is not None:
        # abort() drops buffered data and makes the peer see a reset; close() is an
        # orderly FIN with no response: "server disconnected without sending a response".
        if reset:
            transport.abort()
        else:
            transport.close()
    if record.outcome == "in_progress":
        record.outcome = "faulted"
    # The connection is gone; aiohttp discards whatever is returned here.
    return web.Response(status=499)


def _response(
    record: RequestRecord,
    status: int,
    payload: bytes,
    key: str | None,
    extra_headers: dict[str, str] | None = None,
) -> web.Response:
    headers = {"Request-Id": record.request_id, **(extra_headers or {})}
    if key is not None:
        headers["Idempotency-Key"] = key
    return web.Response(
        status=status, body=payload, content_type="application/json", headers=headers
    )


def _error_response(
    record: RequestRecord, outcome: str, error: StripeApiError, key: str | None
) -> web.Response:
    record.status, record.outcome = error.status, outcome
    return _response(record, error.status, json.dumps(error.body(), indent=2).encode(), key)


def _rate_limited() -> StripeApiError:
    return StripeApiError(
        429,
        "invalid_request_error",
        "Request rate limit exceeded. Learn more about rate limits here "
        "https://stripe.com/docs/rate-limits.",
        code="rate_limit",
    )


def _server_error(status: int) -> StripeApiError:
    return StripeApiError(
        status, "api_error", "An unknown error occurred while processing your request."
    )


def _key_reused(key: str | None) -> StripeApiError:
    return StripeApiError(
        400,
        "idempotency_error",
        "Keys for idempotent requests can only be used with the same parameters they were "
        f"first used with. Try using a key other than '{key}' if you meant to execute a "
        "different request.",
    )


def _key_in_use() -> StripeApiError:
    return invalid_request(
        "There is currently another in-progress request using this Idempotent Key (that "
        "probably means you submitted twice, and the other request is still going through): "
        "please try again later.",
        code="idempotency_key_in_use",
        status=409,
    )


# -- control API ---------------------------------------------------------------------


async def _add_fault(request: web.Request) -> web.Response:
    try:
        data = await request.json()
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        rule = FaultRule.from_json(data)
    except ValueError as error:
        return web.json_response({"error": str(error)}, status=400)
    request.app[PROVIDER].faults.add(rule)
    return web.json_response(rule.to_json(), status=201)


async def _list_faults(request: web.Request) -> web.Response:
    rules = request.app[PROVIDER].faults.rules()
    return web.json_response({"data": [rule.to_json() for rule in rules]})


async def _clear_faults(request: web.Request) -> web.Response:
    request.app[PROVIDER].faults.clear()
    return web.json_response({"data": []})


async def _ledger(request: web.Request) -> web.Response:
    entries = request.app[PROVIDER].account.ledger
    return web.json_response({"data": [entry.to_json() for entry in entries]})


async def _requests(request: web.Request) -> web.Response:
    records = request.app[PROVIDER].account.requests
    return web.json_response({"data": [record.to_json() for record in records]})


async def _reset(request: web.Request) -> web.Response:
    request.app[PROVIDER].reset()
    return web.json_response({"reset": True})


async def _forget(request: web.Request) -> web.Response:
    try:
        data = await request.json()
        if not isinstance(data, dict) or not isinstance(data.get("object_id"), str):
            raise ValueError('expected {"object_id": "pi_..." or "re_..."}')
    except ValueError as error:
        return web.json_response({"error": str(error)}, status=400)
    forgotten = request.app[PROVIDER].account.forget(data["object_id"])
    if not forgotten:
        return web.json_response({"error": f"no object {data['object_id']}"}, status=404)
    return web.json_response({"forgotten": forgotten})


async def _config(request: web.Request) -> web.Response:
    config = asdict(request.app[PROVIDER].config)
    config["api_keys"] = sorted(config["api_keys"]) if config["api_keys"] is not None else None
    return web.json_response(config)


async def _configure(request: web.Request) -> web.Response:
    try:
        data = await request.json()
        allowed = {"key_retention_seconds", "search_lag_seconds"}
        if not isinstance(data, dict) or set(data) - allowed:
            raise ValueError(f"expected a JSON object with only {sorted(allowed)}")
        values = {name: data.get(name) for name in allowed}
        if any(
            v is not None and not (isinstance(v, (int, float)) and v >= 0) for v in values.values()
        ):
            raise ValueError("settings must be non-negative numbers")
    except ValueError as error:
        return web.json_response({"error": str(error)}, status=400)
    request.app[PROVIDER].configure(
        key_retention_seconds=values["key_retention_seconds"],
        search_lag_seconds=values["search_lag_seconds"],
    )
    return await _config(request)
