"""ticketdesk's help-desk service: a small HTTP API that dedupes keyed requests as Stripe does.

It stands for any far-side service a tool calls. State is in memory; the ledger keeps
every ticket ever created, so a test can count effects instead of trusting answers::

    POST /tickets          create a ticket; honours ``Idempotency-Key`` (kept KEY_RETENTION):
                             new key                    -> create, store the answer
                             same key, same body, done  -> the stored answer replayed,
                                                           ``Idempotent-Replayed: true``
                             same key, other body       -> 422
                             same key, first in flight  -> 409 (ask again later)
    POST /legacy/tickets   create a ticket; ignores any idempotency header
    GET  /tickets          the ledger; ``?NAME=VALUE`` keeps tickets whose metadata matches
    GET  /tickets/{id}     one ticket
    POST /_faults          {"drop_responses": N, "delay_seconds": S}: the next N creating
                           requests (replays included) commit and then close the connection
                           without answering;
                           with ``delay_seconds`` each creating request is held that long
                           before committing (while its key is in flight)

A ticket body is ``{"title": str, "description": str, "metadata": {str: str}}``. Every
answer carries a ``Request-Id`` header; a replay also names the ``Original-Request``.
"""

import argparse
import asyncio
import hashlib
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

KEY_RETENTION = timedelta(hours=24)
"""How long ``POST /tickets`` remembers an idempotency key after its first request."""
READY_LINE = "ticketdesk service ready on "

_MAX_KEY_LENGTH = 255
_MAX_TITLE = 200
_MAX_DESCRIPTION = 4000


@dataclass
class _KeyRecord:
    fingerprint: str
    first_seen: datetime
    answer: tuple[int, dict[str, Any], str] | None = None
    """(status, body, request id) once the first request finished; None while in flight."""


@dataclass
class Desk:
    """The service's whole state: the ledger, the remembered keys, the pending faults."""

    tickets: list[dict[str, Any]] = field(default_factory=list)
    keys: dict[str, _KeyRecord] = field(default_factory=dict)
    drop_responses: int = 0
    delay_seconds: float = 0.0

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """Commit one ticket to the ledger and return it."""
        ticket = {
            "id": f"tkt_{len(self.tickets) + 1:04d}",
            "title": body["title"],
            "description": body.get("description", ""),
            "metadata": dict(body.get("metadata", {})),
            "created_at": datetime.now(UTC).isoformat(),
        }
        self.tickets.append(ticket)
        return ticket

    def forget_expired_keys(self, now: datetime) -> None:
        """Drop finished keys older than ``KEY_RETENTION``; a key in flight is kept."""
        expired = [
            key
            for key, record in self.keys.items()
            if record.answer is not None and now - record.first_seen > KEY_RETENTION
        ]
        for key in expired:
            del self.keys[key]


DESK = web.AppKey("desk", Desk)


def build_app() -> web.Application:
    """The service's aiohttp application, with empty state."""
    app = web.Application()
    app[DESK] = Desk()
    app.add_routes(
        [
            web.post("/tickets", create_keyed),
            web.post("/legacy/tickets", create_unkeyed),
            web.get("/tickets", list_tickets),
            web.get("/tickets/{ticket_id}", get_ticket),
            web.post("/_faults", set_faults),
            web.get("/_faults", get_faults),
        ]
    )
    return app


async def create_keyed(request: web.Request) -> web.StreamResponse:
    """``POST /tickets``: create once per ``Idempotency-Key``."""
    desk = request.app[DESK]
    request_id = _new_request_id()
    body = await _ticket_body(request, request_id)
    if isinstance(body, web.Response):
        return body
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return await _commit(request, desk, body, request_id)
    if not 0 < len(key) <= _MAX_KEY_LENGTH:
        return _problem(400, "Idempotency-Key must hold 1 to 255 characters", request_id)
    now = datetime.now(UTC)
    desk.forget_expired_keys(now)
    fingerprint = _fingerprint(request.path, body)
    record = desk.keys.get(key)
    if record is not None:
        if record.fingerprint != fingerprint:
            return _problem(
                422, "this Idempotency-Key was used with a different request", request_id
            )
        if record.answer is None:
            return _problem(409, "a request with this Idempotency-Key is in flight", request_id)
        status, stored, original = record.answer
        if _lose_answer(request, desk):
            return web.Response(status=499)  # aiohttp discards it: the connection is gone
        return _json(
            status,
            stored,
            request_id,
            {"Idempotent-Replayed": "true", "Original-Request": original},
        )
    record = desk.keys[key] = _KeyRecord(fingerprint=fingerprint, first_seen=now)
    return await _commit(request, desk, body, request_id, record)


async def create_unkeyed(request: web.Request) -> web.StreamResponse:
    """``POST /legacy/tickets``: create a ticket on every request, keyed or not."""
    desk = request.app[DESK]
    request_id = _new_request_id()
    body = await _ticket_body(request, request_id)
    if isinstance(body, web.Response):
        return body
    return await _commit(request, desk, body, request_id)


async def list_tickets(request: web.Request) -> web.Response:
    """``GET /tickets``: every ticket created, optionally filtered by metadata."""
    wanted = dict(request.query)
    tickets = [
        ticket
        for ticket in request.app[DESK].tickets
        if all(ticket["metadata"].get(name) == value for name, value in wanted.items())
    ]
    return _json(200, {"tickets": tickets}, _new_request_id())


async def get_ticket(request: web.Request) -> web.Response:
    """``GET /tickets/{id}``."""
    request_id = _new_request_id()
    for ticket in request.app[DESK].tickets:
        if ticket["id"] == request.match_info["ticket_id"]:
            return _json(200, ticket, request_id)
    return _problem(404, "no such ticket", request_id)


async def set_faults(request: web.Request) -> web.Response:
    """``POST /_faults``: arm faults for the next creating requests."""
    desk = request.app[DESK]
    try:
        faults = await request.json()
        drop = int(faults.get("drop_responses", desk.drop_responses))
        delay = float(faults.get("delay_seconds", desk.delay_seconds))
    except (ValueError, TypeError, AttributeError):
        return _problem(400, "expected {drop_responses: int, delay_seconds: float}", "")
    if drop < 0 or not 0 <= delay <= 60:
        return _problem(400, "drop_responses >= 0 and 0 <= delay_seconds <= 60", "")
    desk.drop_responses, desk.delay_seconds = drop, delay
    return await get_faults(request)


async def get_faults(request: web.Request) -> web.Response:
    """``GET /_faults``: the faults still armed."""
    desk = request.app[DESK]
    return web.json_response(
        {"drop_responses": desk.drop_responses, "delay_seconds": desk.delay_seconds}
    )


async def _commit(
    request: web.Request,
    desk: Desk,
    body: dict[str, Any],
    request_id: str,
    record: _KeyRecord | None = None,
) -> web.StreamResponse:
    try:
        if desk.delay_seconds:
            await asyncio.sleep(desk.delay_seconds)
    except BaseException:
        # Nothing was created: forget the key, as Stripe does when execution never began.
        if record is not None:
            desk.keys = {key: kept for key, kept in desk.keys.items() if kept is not record}
        raise
    ticket = desk.create(body)
    if record is not None:
        record.answer = (201, ticket, request_id)
    if _lose_answer(request, desk):
        return web.Response(status=499)  # aiohttp discards it: the connection is gone
    return _json(201, ticket, request_id)


def _lose_answer(request: web.Request, desk: Desk) -> bool:
    """Spend one armed dropped answer: close the connection with no answer, so the caller
    cannot tell whether the ticket exists (it does, with its key stored)."""
    if desk.drop_responses <= 0:
        return False
    desk.drop_responses -= 1
    if request.transport is not None:
        request.transport.close()
    return True


async def _ticket_body(request: web.Request, request_id: str) -> dict[str, Any] | web.Response:
    try:
        body = await request.json()
    except ValueError:
        return _problem(400, "the body is not JSON", request_id)
    if not isinstance(body, dict):
        return _problem(400, "the body is not a JSON object", request_id)
    title, description = body.get("title"), body.get("description", "")
    metadata = body.get("metadata", {})
    if not isinstance(title, str) or not 0 < len(title) <= _MAX_TITLE:
        return _problem(400, f"title must be a string of 1 to {_MAX_TITLE} characters", request_id)
    if not isinstance(description, str) or len(description) > _MAX_DESCRIPTION:
        return _problem(400, "description must be a string", request_id)
    if not isinstance(metadata, dict) or not all(
        isinstance(name, str) and isinstance(value, str) for name, value in metadata.items()
    ):
        return _problem(400, "metadata must map strings to strings", request_id)
    return {"title": title, "description": description, "metadata": metadata}


def _fingerprint(path: str, body: dict[str, Any]) -> str:
    canonical = json.dumps([path, body], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _new_request_id() -> str:
    return f"req_{secrets.token_hex(8)}"


def _json(
    status: int,
    body: dict[str, Any],
    request_id: str,
    headers: dict[str, str] | None = None,
) -> web.Response:
    return web.json_response(
        body, status=status, headers={"Request-Id": request_id, **(headers or {})}
    )


def _problem(status: int, detail: str, request_id: str) -> web.Response:
    return _json(status, {"error": {"status": status, "detail": detail}}, request_id)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m ticketdesk.service --port N``: serve until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m ticketdesk.service",
        description="ticketdesk's local help-desk service (in memory).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind")
    parser.add_argument("--port", type=int, default=8700, help="port to bind; 0 picks one")
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
