"""One trace per task reaches past the outbox: the relay's SMTP delivery is in it.

A task with ``send_email`` is started through the gateway; the ``send_email`` attempt
arms the outbox row with its trace context, and the ``onceflow relay`` process (a process
of its own, exporting over OTLP) delivers the email to the SMTP sink in a span that is
the attempt's child. Rows without a usable trace context (armed before the migration, or
holding a malformed value) are still delivered, each in a trace of its own.
"""

import uuid
from typing import Any

import httpx
import psycopg

from onceflow.tools.worker import key_digest
from onceflow.workflows.agent_task import TRACE_ID_MEMO
from onceflow.workflows.task_models import TaskState

from .conftest import MailRelay, ReceivedSpan, TelemetryStack
from .test_trace import attempts_of, children, gateway_request_arrived


def deliveries_of(spans: list[ReceivedSpan], message_id: str) -> list[ReceivedSpan]:
    return [
        span
        for span in spans
        if span.name == "smtp deliver" and span.attributes.get("smtp.message_id") == message_id
    ]


def stored_trace_context(database_url: str, message_id: str) -> tuple[Any, ...]:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT o.traceparent, o.tracestate, o.state FROM email_outbox o"
            " JOIN email_messages m USING (event_id) WHERE m.message_id = %s",
            (message_id,),
        ).fetchone()
    assert row is not None
    return tuple(row)


async def test_a_task_s_trace_holds_the_gateway_the_attempt_and_the_relay_s_delivery(
    stack: TelemetryStack, mail: MailRelay, http: httpx.AsyncClient
) -> None:
    tenant, auth = await stack.new_agent(tools=("send_email",))
    key = f"agent-mail-{uuid.uuid4().hex}"
    body_text = f"Your order ships tomorrow. PLANTED-BODY-{uuid.uuid4().hex}"
    answer = await http.post(
        f"{stack.gateway_url}/v1/tasks",
        json={
            "steps": [
                {
                    "step_id": "mail",
                    "tool": "send_email",
                    "arguments": {
                        "to": ["ada@example.com"],
                        "subject": "Shipping update",
                        "body": body_text,
                    },
                }
            ]
        },
        headers={**auth, "Idempotency-Key": key},
    )
    assert answer.status_code in (200, 202), answer.text  # 200: it ended within the wait
    task_id = answer.json()["task_id"]
    final = await stack.tasks.result(task_id)
    assert final.state is TaskState.SUCCEEDED
    message_id = final.step("mail").resource_id
    assert message_id is not None

    # The email really went out, once.
    [received] = [m for m in mail.sink.sink.received if m.message_id == message_id]
    assert received.rcpt_tos == ["ada@example.com"]
    assert body_text in received.body
    assert mail.sink.sink.applications(message_id) == 1

    trace_id = (await (await stack.client.get_workflow_handle(task_id).describe()).memo())[
        TRACE_ID_MEMO
    ]
    # Three processes export on their own schedules: wait for every span asserted on.
    spans = await stack.otlp.wait_for_spans(
        lambda spans: (
            bool(deliveries_of(spans, message_id))
            and bool(attempts_of(spans, task_id, "send_email"))
            and any(
                s.name == "RunWorkflow:AgentTaskWorkflow"
                and s.attributes.get("temporalWorkflowID") == task_id
                for s in spans
            )
            and gateway_request_arrived(spans, tenant)
        )
    )
    # Gateway: the request's spans open the trace.
    [root] = [s for s in spans if s.trace_id == trace_id and not s.parent_span_id]
    assert (root.name, root.service) == ("POST /v1/tasks", "onceflow-gateway")
    [request] = [
        s for s in spans if s.name == "tasks.create" and s.attributes["onceflow.tenant"] == tenant
    ]
    assert request.trace_id == trace_id
    assert request.attributes["onceflow.key_digest"] == key_digest(key)
    # Worker: the workflow and the attempt that armed the email.
    workflow_spans = [
        s
        for s in spans
        if s.name == "RunWorkflow:AgentTaskWorkflow"
        and s.attributes.get("temporalWorkflowID") == task_id
    ]
    assert workflow_spans and {s.trace_id for s in workflow_spans} == {trace_id}
    [attempt] = attempts_of(spans, task_id, "send_email")
    assert (attempt.trace_id, attempt.service) == (trace_id, "onceflow-worker")
    assert attempt.attributes["onceflow.outcome"] == "succeeded"
    # Relay: the SMTP delivery, the attempt's child, in the same trace.
    [delivery] = deliveries_of(spans, message_id)
    assert delivery.service == "onceflow-relay"
    assert delivery.trace_id == trace_id
    assert delivery.parent_span_id == attempt.span_id
    assert delivery in children(spans, attempt)
    assert delivery.attributes["smtp.outcome"] == "delivered"
    assert delivery.attributes["onceflow.relay"].startswith("relay-")

    # The row carries ids and flags only: the attempt's span, no key, no body.
    traceparent, tracestate, state = stored_trace_context(stack.database_url, message_id)
    assert state == "delivered"
    prefix = f"00-{trace_id}-{attempt.span_id}-"
    assert traceparent.startswith(prefix) and int(traceparent.removeprefix(prefix), 16) & 1
    assert tracestate is None
    for export in stack.otlp.raw_exports():
        assert key.encode() not in export
        assert body_text.encode() not in export
    for log in (mail.relay.log(), stack.logs()):
        assert key not in log and body_text not in log


async def test_rows_without_a_usable_trace_context_deliver_in_traces_of_their_own(
    stack: TelemetryStack, mail: MailRelay
) -> None:
    # As a row armed before migration 9 (NULL) or damaged in the database looks.
    stored = {
        "legacy": None,
        "malformed": "00-not-a-trace-context",
        "zero-ids": f"00-{'0' * 32}-{'0' * 16}-01",
    }
    message_ids: dict[str, str] = {}
    with psycopg.connect(stack.database_url) as conn, conn.transaction():
        for name, traceparent in stored.items():
            event_id = f"ofv1_{uuid.uuid4().hex}"
            message_ids[name] = f"<{event_id}@onceflow.local>"
            conn.execute(
                "INSERT INTO email_messages (event_id, message_id, tenant, workflow_id,"
                " step_id, sender, recipients, subject, body)"
                " VALUES (%s, %s, 'otel-legacy', 'legacy-task', 'mail', 'onceflow@localhost',"
                " ARRAY['bob@example.com'], %s, 'Hello')",
                (event_id, message_ids[name], f"{name} row"),
            )
            conn.execute(
                "INSERT INTO email_outbox (event_id, state, arming, armed_by_attempt,"
                " traceparent, tracestate) VALUES (%s, 'pending', 1, 1, %s, 'x=y')",
                (event_id, traceparent),
            )

    spans = await stack.otlp.wait_for_spans(
        lambda spans: all(deliveries_of(spans, m) for m in message_ids.values())
    )
    trace_ids = set()
    for name, message_id in message_ids.items():
        assert mail.sink.sink.applications(message_id) == 1, name
        assert stored_trace_context(stack.database_url, message_id)[2] == "delivered"
        [delivery] = deliveries_of(spans, message_id)
        assert delivery.parent_span_id == "", name  # the root of a trace of its own
        assert delivery.attributes["smtp.outcome"] == "delivered"
        trace_ids.add(delivery.trace_id)
    assert len(trace_ids) == len(message_ids)
    log = mail.relay.log()
    for name in ("malformed", "zero-ids"):
        event_id = message_ids[name].strip("<>").split("@")[0]
        assert f"email {event_id}: ignored a malformed traceparent" in log
    assert "Traceback" not in log
