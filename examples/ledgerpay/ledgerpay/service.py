"""ledgerpay's payment service: charges and refunds in memory, with idempotency rules that
differ from Stripe's in the three ways a tool has to respect.

- **Keys are kept one hour** (``KEY_RETENTION``) from their first request. After that
  the same key is a new request: a charge sent again makes a second charge.
- **No stored 500s.** A request that fails inside the service rolls back and its key is
  forgotten with it, so the same key sent again executes afresh. (Stripe stores the 500
  under the key and replays it for every repeat.)
- **A consistent look-up by reference.** ``GET /charges?reference=…`` reads the ledger
  itself, so a charge is found the moment it committed and a miss proves there is none.
  (Stripe's search is eventually consistent: a miss there proves nothing.)

State is in memory; the ledger keeps every charge, refund and creating request, so a
test counts effects instead of trusting answers::

    POST /charges        {"amount", "currency", "customer", "payment_method",
                          "description", "reference"}: charge, once per Idempotency-Key
    POST /refunds        {"charge", "amount" (default: what is left), "reference"}
    GET  /charges        the charges; ?reference=R, ?customer=C filter (consistent)
    GET  /charges/{id}
    GET  /refunds        the refunds; ?reference=R, ?charge=ID filter (consistent)
    GET  /refunds/{id}
    GET  /_ledger        every charge, refund and creating request received, in order
    POST /_faults        {"drop_responses": N}: the next N creating requests commit, then
                         close the connection unanswered;
                         {"fail_without_commit": N}: the next N answer 500, commit nothing
                         and forget their key;
                         {"hold_requests": N}: the next N wait (their key in flight) until
                         ``POST /_release``; the other faults apply when they go on
    GET  /_faults        what is armed, and ``held``: how many requests wait now
    POST /_release       let every held request go on
    POST /_clock         {"advance_seconds": S}: move the service's clock on (keys expire)

A creating request with an ``Idempotency-Key``::

    new key, or one older than KEY_RETENTION -> execute; a 2xx or 4xx answer is stored
    same key, same body, answered            -> the stored answer, Idempotent-Replayed: true
    same key, other body                     -> 422 idempotency_mismatch
    same key, first request still running    -> 409 key_in_flight
    execution failed (500)                   -> the key is forgotten: a repeat executes

Errors are ``{"error": {"type", "detail"}}``: 400 ``invalid_request``, 402
``card_declined`` (payment method ``pm_card_declined``), 404 ``not_found``, 422
``idempotency_mismatch`` or ``nothing_to_refund``, 409 ``key_in_flight``, 500
``internal``. Every answer carries ``Request-Id``; a replay names the ``Original-Request``.
"""

import argparse
import asyncio
import hashlib
import json
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

KEY_RETENTION = timedelta(hours=1)
"""How long a creating request's answer is kept under its idempotency key."""
DECLINED_PAYMENT_METHOD = "pm_card_declined"
"""The payment method every charge of which is declined (402)."""
READY_LINE = "ledgerpay service ready on "

_FAULTS = ("drop_responses", "fail_without_commit", "hold_requests")
_MAX_KEY_LENGTH = 255
_CURRENCY = re.compile(r"^[a-z]{3}$")
_LARGEST_AMOUNT = 99_999_999
_LONGEST_TEXT = 500

Answer = tuple[int, dict[str, Any]]
"""An HTTP status and its JSON body."""


@dataclass
class _KeyRecord:
    fingerprint: str
    first_seen: datetime
    answer: tuple[int, dict[str, Any], str] | None = None
    """(status, body, request id) once the first request answered; None while running."""


@dataclass
class Payments:
    """The service's whole state: the ledger, the remembered keys, the armed faults."""

    charges: list[dict[str, Any]] = field(default_factory=list)
    refunds: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    """Every creating request received: path, reference, request id, and its answer."""
    keys: dict[str, _KeyRecord] = field(default_factory=dict)
    drop_responses: int = 0
    fail_without_commit: int = 0
    hold_requests: int = 0
    held: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)
    clock_offset: timedelta = timedelta(0)

    def now(self) -> datetime:
        """The service's clock: the wall clock, moved on by ``POST /_clock``."""
        return datetime.now(UTC) + self.clock_offset

    def remembered(self, key: str, now: datetime) -> _KeyRecord | None:
        """The key's record, unless it answered more than ``KEY_RETENTION`` ago."""
        record = self.keys.get(key)
        if record is not None and record.answer is not None:
            if now - record.first_seen > KEY_RETENTION:
                del self.keys[key]
                return None
        return record

    def forget(self, record: _KeyRecord | None) -> None:
        """Drop a key's record (the request it belongs to committed nothing)."""
        if record is not None:
            self.keys = {key: kept for key, kept in self.keys.items() if kept is not record}

    def charge(self, body: dict[str, Any], request_id: str) -> Answer:
        """Commit one charge to the ledger, or decline it."""
        if body["payment_method"] == DECLINED_PAYMENT_METHOD:
            return 402, _error("card_declined", "the card was declined; nothing was charged")
        charge = {
            "id": f"ch_{len(self.charges) + 1:06d}",
            "amount": body["amount"],
            "currency": body["currency"],
            "customer": body["customer"],
            "payment_method": body["payment_method"],
            "description": body["description"],
            "reference": body["reference"],
            "amount_refunded": 0,
            "status": "succeeded",
            "request_id": request_id,
            "created_at": self.now().isoformat(),
        }
        self.charges.append(charge)
        return 201, dict(charge)

    def refund(self, body: dict[str, Any], request_id: str) -> Answer:
        """Commit one refund of a charge, or refuse it."""
        charge = next((c for c in self.charges if c["id"] == body["charge"]), None)
        if charge is None:
            return 404, _error("not_found", f"no charge {body['charge']}")
        left = charge["amount"] - charge["amount_refunded"]
        amount = body["amount"] if body["amount"] is not None else left
        if left == 0 or amount > left:
            return 422, _error(
                "nothing_to_refund", f"{amount} asked, {left} of charge {charge['id']} is left"
            )
        charge["amount_refunded"] += amount
        refund = {
            "id": f"re_{len(self.refunds) + 1:06d}",
            "charge": charge["id"],
            "amount": amount,
            "currency": charge["currency"],
            "reference": body["reference"],
            "status": "succeeded",
            "request_id": request_id,
            "created_at": self.now().isoformat(),
        }
        self.refunds.append(refund)
        return 201, dict(refund)


PAYMENTS = web.AppKey("payments", Payments)


def build_app() -> web.Application:
    """The service's aiohttp application, with empty state."""
    app = web.Application()
    app[PAYMENTS] = Payments()
    app.add_routes(
        [
            web.post("/charges", create_charge),
            web.post("/refunds", create_refund),
            web.get("/charges", list_charges),
            web.get("/charges/{id}", get_charge),
            web.get("/refunds", list_refunds),
            web.get("/refunds/{id}", get_refund),
            web.get("/_ledger", get_ledger),
            web.post("/_faults", set_faults),
            web.get("/_faults", get_faults),
            web.post("/_release", release_held),
            web.post("/_clock", advance_clock),
        ]
    )
    return app


async def create_charge(request: web.Request) -> web.StreamResponse:
    """``POST /charges``: charge once per ``Idempotency-Key``."""
    return await _create(request, _charge_body, Payments.charge)


async def create_refund(request: web.Request) -> web.StreamResponse:
    """``POST /refunds``: refund once per ``Idempotency-Key``."""
    return await _create(request, _refund_body, Payments.refund)


async def list_charges(request: web.Request) -> web.Response:
    """``GET /charges``: read from the ledger itself, so it is read-after-write consistent."""
    return _listed(request, "charges", request.app[PAYMENTS].charges, ("reference", "customer"))


async def list_refunds(request: web.Request) -> web.Response:
    """``GET /refunds``: as consistent as ``GET /charges``."""
    return _listed(request, "refunds", request.app[PAYMENTS].refunds, ("reference", "charge"))


async def get_charge(request: web.Request) -> web.Response:
    """``GET /charges/{id}``."""
    return _one(request, request.app[PAYMENTS].charges)


async def get_refund(request: web.Request) -> web.Response:
    """``GET /refunds/{id}``."""
    return _one(request, request.app[PAYMENTS].refunds)


async def get_ledger(request: web.Request) -> web.Response:
    """``GET /_ledger``: every charge, refund and creating request, for tests to count."""
    payments = request.app[PAYMENTS]
    return web.json_response(
        {"charges": payments.charges, "refunds": payments.refunds, "requests": payments.requests}
    )


async def set_faults(request: web.Request) -> web.Response:
    """``POST /_faults``: arm faults for the next creating requests."""
    payments = request.app[PAYMENTS]
    try:
        faults = await request.json()
        armed = {name: int(faults.get(name, getattr(payments, name))) for name in _FAULTS}
    except (ValueError, TypeError, AttributeError):
        return _problem(400, "invalid_request", "expected integer counts: " + ", ".join(_FAULTS))
    if any(count < 0 for count in armed.values()):
        return _problem(400, "invalid_request", "fault counts are >= 0")
    for name, count in armed.items():
        setattr(payments, name, count)
    return await get_faults(request)


async def get_faults(request: web.Request) -> web.Response:
    """``GET /_faults``: the faults still armed, and how many requests are held now."""
    payments = request.app[PAYMENTS]
    return web.json_response(
        {**{name: getattr(payments, name) for name in _FAULTS}, "held": payments.held}
    )


async def release_held(request: web.Request) -> web.Response:
    """``POST /_release``: every held request goes on."""
    payments = request.app[PAYMENTS]
    payments.released.set()
    payments.released = asyncio.Event()
    return await get_faults(request)


async def advance_clock(request: web.Request) -> web.Response:
    """``POST /_clock``: move the service's clock on, as if that much time had passed."""
    payments = request.app[PAYMENTS]
    try:
        seconds = float((await request.json())["advance_seconds"])
    except (ValueError, TypeError, KeyError):
        return _problem(400, "invalid_request", 'expected {"advance_seconds": number}')
    if seconds < 0:
        return _problem(400, "invalid_request", "the clock only moves on")
    payments.clock_offset += timedelta(seconds=seconds)
    return web.json_response({"now": payments.now().isoformat()})


async def _create(
    request: web.Request,
    parse: Callable[[Any], dict[str, Any] | str],
    execute: Callable[[Payments, dict[str, Any], str], Answer],
) -> web.StreamResponse:
    """One creating request, under the service's idempotency rules (module docstring)."""
    payments = request.app[PAYMENTS]
    request_id = _new_request_id()
    try:
        body = parse(await request.json())
    except ValueError:
        body = "the body is not JSON"
    if isinstance(body, str):
        return _problem(400, "invalid_request", body, request_id)
    logged: dict[str, Any] = {
        "request_id": request_id,
        "path": request.path,
        "reference": body["reference"],
        "answer": None,
    }
    payments.requests.append(logged)
    key = request.headers.get("Idempotency-Key")
    record = None
    if key is not None:
        if not 0 < len(key) <= _MAX_KEY_LENGTH:
            return _problem(400, "invalid_request", "Idempotency-Key holds 1 to 255 characters")
        now = payments.now()
        fingerprint = _fingerprint(request.path, body)
        record = payments.remembered(key, now)
        if record is not None:
            return _repeat(request, payments, record, fingerprint, request_id, logged)
        record = payments.keys[key] = _KeyRecord(fingerprint=fingerprint, first_seen=now)
    try:
        await _hold(payments)
    except BaseException:
        payments.forget(record)  # nothing ran: the key is free again
        raise
    if payments.fail_without_commit > 0:
        payments.fail_without_commit -= 1
        payments.forget(record)  # no stored 500s: the same key executes next time
        logged["answer"] = 500
        return _problem(500, "internal", "the request failed and committed nothing", request_id)
    status, answer = execute(payments, body, request_id)
    if record is not None:
        record.answer = (status, answer, request_id)
    logged["answer"] = status
    if _lose_answer(request, payments):
        logged["dropped"] = True
        return web.Response(status=499)  # aiohttp discards it: the connection is gone
    return _json(status, answer, request_id)


def _repeat(
    request: web.Request,
    payments: Payments,
    record: _KeyRecord,
    fingerprint: str,
    request_id: str,
    logged: dict[str, Any],
) -> web.StreamResponse:
    """A request under a key the service remembers: refused, or the stored answer."""
    if record.fingerprint != fingerprint:
        logged["answer"] = 422
        return _problem(
            422, "idempotency_mismatch", "this key was used with another request", request_id
        )
    if record.answer is None:
        logged["answer"] = 409
        return _problem(409, "key_in_flight", "a request with this key is running", request_id)
    status, stored, original = record.answer
    logged.update(answer=status, replayed=True)
    if _lose_answer(request, payments):
        logged["dropped"] = True
        return web.Response(status=499)
    headers = {"Idempotent-Replayed": "true", "Original-Request": original}
    return _json(status, stored, request_id, headers)


async def _hold(payments: Payments) -> None:
    if payments.hold_requests <= 0:
        return
    payments.hold_requests -= 1
    payments.held += 1
    try:
        await payments.released.wait()
    finally:
        payments.held -= 1


def _lose_answer(request: web.Request, payments: Payments) -> bool:
    """Spend one armed dropped answer: close the connection unanswered, so the caller
    cannot tell whether the request committed (it did)."""
    if payments.drop_responses <= 0:
        return False
    payments.drop_responses -= 1
    if request.transport is not None:
        request.transport.close()
    return True


def _charge_body(body: Any) -> dict[str, Any] | str:
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    amount, currency = body.get("amount"), body.get("currency")
    if not _is_amount(amount):
        return f"amount must be an integer from 1 to {_LARGEST_AMOUNT}"
    if not isinstance(currency, str) or not _CURRENCY.match(currency):
        return "currency must be three lower-case letters"
    texts = {
        "customer": body.get("customer"),
        "payment_method": body.get("payment_method"),
        "description": body.get("description", ""),
        "reference": body.get("reference", ""),
    }
    for name, value in texts.items():
        if not _is_text(value) or (not value and name in ("customer", "payment_method")):
            return f"{name} must be a string of at most {_LONGEST_TEXT} characters"
    return {"amount": amount, "currency": currency, **texts}


def _refund_body(body: Any) -> dict[str, Any] | str:
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    charge, amount, reference = body.get("charge"), body.get("amount"), body.get("reference", "")
    if not isinstance(charge, str) or not charge:
        return "charge must name a charge"
    if amount is not None and not _is_amount(amount):
        return f"amount must be an integer from 1 to {_LARGEST_AMOUNT}, or absent"
    if not _is_text(reference):
        return f"reference must be a string of at most {_LONGEST_TEXT} characters"
    return {"charge": charge, "amount": amount, "reference": reference}


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= _LONGEST_TEXT


def _is_amount(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= _LARGEST_AMOUNT


def _listed(
    request: web.Request, name: str, rows: list[dict[str, Any]], filters: tuple[str, ...]
) -> web.Response:
    wanted = {key: value for key, value in request.query.items() if key in filters}
    found = [row for row in rows if all(row[key] == value for key, value in wanted.items())]
    return _json(200, {name: found}, _new_request_id())


def _one(request: web.Request, rows: list[dict[str, Any]]) -> web.Response:
    request_id = _new_request_id()
    for row in rows:
        if row["id"] == request.match_info["id"]:
            return _json(200, row, request_id)
    return _problem(404, "not_found", f"no {request.match_info['id']}", request_id)


def _fingerprint(path: str, body: dict[str, Any]) -> str:
    canonical = json.dumps([path, body], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _new_request_id() -> str:
    return f"req_{secrets.token_hex(8)}"


def _error(kind: str, detail: str) -> dict[str, Any]:
    return {"error": {"type": kind, "detail": detail}}


def _json(
    status: int, body: dict[str, Any], request_id: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response(
        body, status=status, headers={"Request-Id": request_id, **(headers or {})}
    )


def _problem(status: int, kind: str, detail: str, request_id: str = "") -> web.Response:
    return _json(status, _error(kind, detail), request_id or _new_request_id())


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m ledgerpay.service --port N``: serve until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m ledgerpay.service",
        description="ledgerpay's local payment service (in memory).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind")
    parser.add_argument("--port", type=int, default=8710, help="port to bind; 0 picks one")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.host, args.port))


async def _serve(host: str, port: int) -> None:
    runner = web.AppRunner(build_app(), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound_host, bound_port = runner.addresses[0][:2]
        print(f"{READY_LINE}http://{bound_host}:{bound_port}", flush=True)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
