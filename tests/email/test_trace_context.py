"""The outbox row carries the arming attempt's W3C trace context to the relay, validated
when read: a row without one (armed before migration 9) or with a malformed one is still
delivered. Real PostgreSQL and the real SMTP sink; the relay's spans are asserted end to
end in tests/telemetry/test_outbox_trace.py."""

from datetime import timedelta

import psycopg
import pytest
from onceflow_devstack.smtp_sink import RunningSink
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from psycopg_pool import AsyncConnectionPool

from onceflow.email import DeliveryOutcome, EmailOutbox, EmailRequest, EmailSettings, OutboxRelay
from onceflow.telemetry import W3CTraceContext

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
LATER_TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    "stored",
    [
        None,
        "",
        42,
        "garbage",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
        TRACEPARENT.upper(),
        f" {TRACEPARENT}",
        f"{TRACEPARENT}-extra",
        "01" + TRACEPARENT[2:],
        "ff" + TRACEPARENT[2:],
        f"00-{'0' * 32}-b7ad6b7169203331-01",
        f"00-0af7651916cd43dd8448eb211c80319c-{'0' * 16}-01",
        "00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01",
    ],
)
def test_a_malformed_traceparent_is_ignored(stored: object) -> None:
    assert W3CTraceContext.parse(stored, "rojo=00f067aa0ba902b7") is None


@pytest.mark.parametrize(
    "tracestate",
    [
        None,
        "",
        "not a list member",
        "a=" + "b" * 600,
        "vendor=sk_live_PLANTEDinTRACESTATE7d2e",
    ],
)
def test_a_malformed_long_or_secret_looking_tracestate_is_dropped(tracestate: object) -> None:
    assert W3CTraceContext.parse(TRACEPARENT, tracestate) == W3CTraceContext(TRACEPARENT)


def test_the_current_span_s_context_round_trips_and_continues_its_trace() -> None:
    assert W3CTraceContext.current() is None  # outside a trace nothing is stored
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("attempt") as attempt:
        captured = W3CTraceContext.current()
    ids = attempt.get_span_context()
    assert captured == W3CTraceContext(
        f"00-{trace.format_trace_id(ids.trace_id)}-{trace.format_span_id(ids.span_id)}-"
        f"{ids.trace_flags:02x}"
    )
    assert ids.trace_flags.sampled
    assert W3CTraceContext.parse(captured.traceparent) == captured
    with tracer.start_as_current_span("delivery", context=captured.parent()) as delivery:
        pass
    assert delivery.parent is not None and delivery.parent.span_id == ids.span_id
    assert delivery.get_span_context().trace_id == ids.trace_id


def request(n: int) -> EmailRequest:
    return EmailRequest(
        event_id=f"ofv1_trace_{n}",
        message_id=f"<ofv1_trace_{n}@onceflow.local>",
        tenant="acme",
        workflow_id="task-trace",
        step_id=f"mail-{n}",
        sender="onceflow@localhost",
        recipients=(f"customer-{n}@example.com",),
        subject=f"Trace context #{n}",
        body="Hello!",
    )


def stored(database: str, event_id: str) -> tuple[str | None, str | None]:
    with psycopg.connect(database) as conn:
        row = conn.execute(
            "SELECT traceparent, tracestate FROM email_outbox WHERE event_id = %s", (event_id,)
        ).fetchone()
    assert row is not None
    return row[0], row[1]


async def test_an_arming_stores_its_trace_context_and_a_re_arming_replaces_it(
    pool: AsyncConnectionPool, database: str
) -> None:
    outbox = EmailOutbox(pool)
    first = W3CTraceContext(TRACEPARENT, "rojo=00f067aa0ba902b7")
    _, armed = await outbox.enqueue(request(1), attempt=1, trace_context=first)
    assert armed
    assert stored(database, "ofv1_trace_1") == (TRACEPARENT, "rojo=00f067aa0ba902b7")
    assert await outbox.withdraw("ofv1_trace_1", arming=1, reason="no relay in time")
    _, armed = await outbox.enqueue(
        request(1), attempt=2, trace_context=W3CTraceContext(LATER_TRACEPARENT)
    )
    assert armed
    assert stored(database, "ofv1_trace_1") == (LATER_TRACEPARENT, None)


async def test_rows_without_or_with_a_malformed_trace_context_are_delivered(
    pool: AsyncConnectionPool, database: str, settings: EmailSettings, sink: RunningSink
) -> None:
    outbox = EmailOutbox(pool)
    for n in range(4):
        await outbox.enqueue(request(n), attempt=1, trace_context=W3CTraceContext(TRACEPARENT))
    with psycopg.connect(database) as conn:
        # 0 keeps its valid context; 1 is a row armed before migration 9; 2 and 3 were
        # damaged in the database.
        for n, traceparent, tracestate in (
            (1, None, None),
            (2, "00-not-a-trace-context", None),
            (3, TRACEPARENT, "\x01 broken"),
        ):
            conn.execute(
                "UPDATE email_outbox SET traceparent = %s, tracestate = %s WHERE event_id = %s",
                (traceparent, tracestate, f"ofv1_trace_{n}"),
            )

    claims = await outbox.claim(relay_id="relay-trace", lease=timedelta(seconds=30), limit=10)
    contexts = {claim.event_id: claim.trace_context for claim in claims}
    assert contexts == {
        "ofv1_trace_0": W3CTraceContext(TRACEPARENT),
        "ofv1_trace_1": None,
        "ofv1_trace_2": None,
        "ofv1_trace_3": W3CTraceContext(TRACEPARENT),  # its tracestate dropped
    }
    relay = OutboxRelay(pool, settings)
    reports = [await relay.deliver_claim(claim) for claim in claims]

    assert [report.outcome if report else None for report in reports] == [
        DeliveryOutcome.DELIVERED
    ] * 4
    for n in range(4):
        assert sink.sink.applications(f"<ofv1_trace_{n}@onceflow.local>") == 1
        row = await outbox.read(f"ofv1_trace_{n}")
        assert row is not None and row.state == "delivered"
