"""One delivery attempt against the real SMTP sink over TCP, classified by how far the
SMTP transaction got; the sink's record shows what actually arrived."""

import asyncio
import socket
from datetime import UTC, datetime

from onceflow_devstack.smtp_sink import RunningSink, SinkFault

from onceflow.email import DeliveryOutcome, DeliveryReport, EmailSettings, OutgoingMessage, deliver
from tests.harness import HANG_SECONDS

MESSAGE = OutgoingMessage(
    message_id="<ofv1_test@onceflow.local>",
    sender="onceflow@localhost",
    recipients=("ada@example.com", "bob@example.com"),
    subject="Your order shipped",
    body="It is on its way.\n.\nA lone dot stays in the text.",
    date=datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC),
)


async def send(smtp_url: str, *, timeout: float = HANG_SECONDS) -> DeliveryReport:
    server = EmailSettings(smtp_url=smtp_url).smtp_server
    return await asyncio.to_thread(deliver, server, MESSAGE, timeout=timeout)


async def test_a_delivered_message_is_applied_once_even_when_delivered_again(
    sink: RunningSink,
) -> None:
    first = await send(sink.smtp_url)
    again = await send(sink.smtp_url)

    assert first.outcome is again.outcome is DeliveryOutcome.DELIVERED
    assert first.smtp_reply is not None and first.smtp_reply.startswith("250")
    assert again.smtp_reply is not None and "duplicate" in again.smtp_reply
    assert sink.sink.deliveries(MESSAGE.message_id) == 2
    assert sink.sink.applications(MESSAGE.message_id) == 1
    [received, duplicate] = sink.sink.received
    assert (received.applied, duplicate.applied) == (True, False)
    assert received.rcpt_tos == ["ada@example.com", "bob@example.com"]
    assert received.subject == "Your order shipped"
    assert "\r\n.\r\n" in received.body  # dot-stuffed on the wire, restored by the server


async def test_refusals_before_the_message_was_sent_are_rejected_or_transient(
    sink: RunningSink,
) -> None:
    sink.sink.add_fault(SinkFault.REJECT_RCPT)
    rejected = await send(sink.smtp_url)
    sink.sink.add_fault(SinkFault.DEFER_RCPT)
    deferred = await send(sink.smtp_url)
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    refused = await send(f"smtp://127.0.0.1:{closed_port}")

    assert rejected.outcome is DeliveryOutcome.REJECTED
    assert "RCPT TO (recipient 1 of 2)" in rejected.reason
    assert deferred.outcome is DeliveryOutcome.TRANSIENT
    assert refused.outcome is DeliveryOutcome.TRANSIENT and "nothing was sent" in refused.reason
    assert "example.com" not in rejected.reason + deferred.reason  # no addresses in reasons
    assert sink.sink.received == []


async def test_a_reply_lost_after_data_is_unknown_whether_or_not_the_server_kept_it(
    sink: RunningSink,
) -> None:
    sink.sink.add_fault(SinkFault.DROP_AFTER_DATA)
    dropped = await send(sink.smtp_url)
    sink.sink.add_fault(SinkFault.DELAY_REPLY, delay_seconds=3.0, apply=False)
    timed_out = await send(sink.smtp_url, timeout=0.5)

    assert dropped.outcome is DeliveryOutcome.UNKNOWN
    assert "connection closed after the message was sent" in dropped.reason
    assert timed_out.outcome is DeliveryOutcome.UNKNOWN
    assert "timeout after the message was sent" in timed_out.reason
    # The first was applied before the connection dropped; the second was lost.
    assert sink.sink.deliveries(MESSAGE.message_id) == 2
    assert sink.sink.applications(MESSAGE.message_id) == 1
