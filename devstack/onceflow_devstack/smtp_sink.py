"""A local SMTP server (aiosmtpd) that keeps what it received and dedupes by Message-ID.

Far-side test infrastructure for the email outbox, never imported by product code. It
plays the consumer: every message whose ``DATA`` completed is kept in ``received`` (a
redelivery appears twice there), and its ``Message-ID`` is *applied* once: a message
whose id was applied before is accepted (250) and changes nothing. Faults make it
misbehave on purpose::

    async with running_smtp_sink() as sink:            # smtp://127.0.0.1:<port>
        sink.sink.add_fault(SinkFault.DROP_AFTER_DATA)  # read it, then hang up, no reply
        ...
        assert sink.sink.applied_ids() == [message_id]

A small HTTP side door (``control_url``) shows the same record as JSON and takes
faults, for the demo and for processes other than the one running the sink.
"""

import asyncio
import email
import email.policy
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from aiohttp import web
from aiosmtpd.smtp import SMTP, Envelope, Session


class SinkFault(StrEnum):
    """Ways the sink misbehaves, each consumed by the next message(s) it concerns."""

    DROP_AFTER_DATA = "drop_after_data"
    """Read the whole message, then close the connection without the final reply."""
    DELAY_REPLY = "delay_reply"
    """Hold the final reply after the message for ``delay_seconds``."""
    REJECT_RCPT = "reject_rcpt"
    """Answer RCPT with 550 (permanent)."""
    DEFER_RCPT = "defer_rcpt"
    """Answer RCPT with 451 (try again later)."""


@dataclass
class FaultRule:
    """One fault and how often it fires."""

    fault: SinkFault
    times: int | None = 1
    """How many messages it concerns; None for every one."""
    delay_seconds: float = 0.0
    """With ``DELAY_REPLY``: how long the reply is held."""
    apply: bool = True
    """With ``DROP_AFTER_DATA`` / ``DELAY_REPLY``: whether the message is applied before
    the connection drops or while the reply is held (a server that queued it), or lost."""


@dataclass(frozen=True)
class ReceivedMessage:
    """One message whose DATA completed, duplicate or not."""

    message_id: str | None
    mail_from: str
    rcpt_tos: list[str]
    subject: str | None
    body: str
    peer: str
    received_at: float
    applied: bool
    """True for the delivery that applied it; False for a duplicate or a lost one."""


@dataclass
class SmtpSink:
    """The sink's state and its aiosmtpd handler hooks."""

    received: list[ReceivedMessage] = field(default_factory=list)
    faults: list[FaultRule] = field(default_factory=list)
    holding: set[str] = field(default_factory=set)
    """Message-IDs whose final reply is being held by ``DELAY_REPLY`` right now."""
    _applications: Counter[str] = field(default_factory=Counter)

    # ── inspection ──────────────────────────────────────────────────────────────────

    def applied_ids(self) -> list[str]:
        """Message-IDs applied, in the order they were first applied."""
        return [m.message_id for m in self.received if m.applied and m.message_id]

    def applications(self, message_id: str) -> int:
        """How many times a Message-ID was applied (the consumer's dedupe keeps it ≤ 1)."""
        return self._applications[message_id]

    def deliveries(self, message_id: str) -> int:
        """How many times a message with this id reached the sink (DATA completed)."""
        return sum(1 for message in self.received if message.message_id == message_id)

    def add_fault(self, fault: SinkFault, **options: Any) -> FaultRule:
        """Queue a fault; the oldest matching rule fires first."""
        rule = FaultRule(fault, **options)
        self.faults.append(rule)
        return rule

    def clear_faults(self) -> None:
        """Forget every queued fault."""
        self.faults.clear()

    def snapshot(self) -> dict[str, Any]:
        """Everything as JSON-ready data."""
        return {
            "received": [asdict(message) for message in self.received],
            "applied": self.applied_ids(),
            "faults": [asdict(rule) for rule in self.faults],
        }

    # ── aiosmtpd hooks ──────────────────────────────────────────────────────────────

    async def handle_RCPT(  # noqa: N802 - aiosmtpd's hook name
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        if self._take(SinkFault.REJECT_RCPT):
            return "550 5.1.1 mailbox unavailable"
        if self._take(SinkFault.DEFER_RCPT):
            return "451 4.3.0 try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(  # noqa: N802 - aiosmtpd's hook name
        self, server: SMTP, session: Session, envelope: Envelope
    ) -> str:
        content = envelope.content if isinstance(envelope.content, bytes) else b""
        parsed = email.message_from_bytes(content, policy=email.policy.default)
        message_id = str(parsed["Message-ID"]).strip() if parsed["Message-ID"] else None
        drop = self._take(SinkFault.DROP_AFTER_DATA)
        delay = self._take(SinkFault.DELAY_REPLY)
        lost = (drop is not None and not drop.apply) or (delay is not None and not delay.apply)
        applied = not lost and (message_id is None or self._applications[message_id] == 0)
        if applied and message_id is not None:
            self._applications[message_id] += 1
        body = parsed.get_body(("plain",))
        self.received.append(
            ReceivedMessage(
                message_id=message_id,
                mail_from=envelope.mail_from or "",
                rcpt_tos=list(envelope.rcpt_tos),
                subject=str(parsed["Subject"]) if parsed["Subject"] else None,
                body=body.get_content() if body is not None else "",
                peer=str(session.peer),
                received_at=time.time(),
                applied=applied,
            )
        )
        if drop is not None and isinstance(server.transport, asyncio.Transport):
            server.transport.abort()
            await asyncio.Event().wait()  # aiosmtpd cancels this when it sees the loss
        if delay is not None:
            held = message_id or ""
            self.holding.add(held)
            try:
                await asyncio.sleep(delay.delay_seconds)
            finally:
                self.holding.discard(held)
        if not applied and not lost:
            return "250 2.0.0 already delivered (duplicate Message-ID ignored)"
        return "250 2.0.0 accepted"

    def _take(self, fault: SinkFault) -> FaultRule | None:
        for rule in self.faults:
            if rule.fault is fault:
                if rule.times is not None:
                    rule.times -= 1
                    if rule.times <= 0:
                        self.faults.remove(rule)
                return rule
        return None


@dataclass(frozen=True)
class RunningSink:
    """A sink serving SMTP (and its HTTP side door)."""

    smtp_url: str
    """``smtp://host:port``, to use as ``SMTP_URL``."""
    control_url: str | None
    """``http://host:port`` of the JSON side door, when it was asked for."""
    sink: SmtpSink


@asynccontextmanager
async def running_smtp_sink(
    sink: SmtpSink | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    control_port: int | None = None,
) -> AsyncIterator[RunningSink]:
    """Serve the sink in the current event loop for the duration of the block.

    Args:
        sink: State to serve; a fresh one by default.
        host: Interface to bind. Default ``"127.0.0.1"``.
        port: SMTP port; 0 picks a free one. Default 0.
        control_port: Port of the HTTP side door; None for none, 0 for a free one.
    """
    state = sink or SmtpSink()
    sessions: list[SMTP] = []

    def session() -> SMTP:
        protocol = SMTP(state, hostname="onceflow-sink", ident="onceflow SMTP sink")
        sessions.append(protocol)
        return protocol

    server = await asyncio.get_running_loop().create_server(session, host, port)
    runner: web.AppRunner | None = None
    control_url = None
    try:
        bound = server.sockets[0].getsockname()
        if control_port is not None:
            runner = web.AppRunner(_control_app(state), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, host, control_port).start()
            control_host, bound_control = runner.addresses[0][:2]
            control_url = f"http://{control_host}:{bound_control}"
        yield RunningSink(f"smtp://{bound[0]}:{bound[1]}", control_url, state)
    finally:
        server.close()
        for protocol in sessions:
            if protocol.transport is not None:
                protocol.transport.close()
        await server.wait_closed()
        if runner is not None:
            await runner.cleanup()


def _control_app(sink: SmtpSink) -> web.Application:
    async def messages(request: web.Request) -> web.Response:
        return web.json_response(sink.snapshot())

    async def add_fault(request: web.Request) -> web.Response:
        options = await request.json()
        try:
            rule = sink.add_fault(SinkFault(options.pop("fault")), **options)
        except (KeyError, TypeError, ValueError) as error:
            return web.json_response({"error": str(error)}, status=400)
        return web.json_response(asdict(rule))

    async def clear_faults(request: web.Request) -> web.Response:
        sink.clear_faults()
        return web.json_response({"faults": []})

    app = web.Application()
    app.router.add_get("/messages", messages)
    app.router.add_post("/faults", add_fault)
    app.router.add_delete("/faults", clear_faults)
    return app
