"""One trace per task: gateway → workflow → every attempt → the provider call, over OTLP.

The task charges (the provider commits, then the connection drops: the response is lost
and the retry replays the same PaymentIntent) and refunds (the provider commits, then
answers 500 and keeps answering it: the step parks). Real processes export over OTLP/gRPC
to the receiver in this process; nothing about the spans is faked.
"""

import uuid

import httpx
from onceflow_devstack.stripe_provider import Fault
from opentelemetry.trace import SpanKind

from onceflow.retry_policy import OutcomeClass
from onceflow.tools.worker import key_digest
from onceflow.workflows.agent_task import TRACE_ID_MEMO
from onceflow.workflows.task_models import TaskState
from tests.payments.conftest import FAST_BUDGET, VISA_CHARGE

from .conftest import ReceivedSpan, TelemetryStack
from .replay_spans import spans_emitted_by_replay


def attempts_of(spans: list[ReceivedSpan], workflow_id: str, activity: str) -> list[ReceivedSpan]:
    return sorted(
        (
            span
            for span in spans
            if span.name == f"RunActivity:{activity}"
            and span.attributes.get("temporalWorkflowID") == workflow_id
        ),
        key=lambda span: span.attributes.get("onceflow.attempt", 0),
    )


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    return [span for span in spans if span.parent_span_id == parent.span_id]


def gateway_request_arrived(spans: list[ReceivedSpan], tenant: str) -> bool:
    """Whether the gateway's ``tasks.create`` span for ``tenant`` and its trace's root (the
    HTTP request) have reached the receiver: the gateway exports on its own schedule, so a
    worker's span arriving says nothing about them."""
    requests = [
        s
        for s in spans
        if s.name == "tasks.create" and s.attributes.get("onceflow.tenant") == tenant
    ]
    return any(
        s.trace_id == request.trace_id and not s.parent_span_id
        for request in requests
        for s in spans
    )


async def test_a_lost_response_and_a_park_are_one_trace_with_every_attempt(
    stack: TelemetryStack, http: httpx.AsyncClient
) -> None:
    await stack.control.add_fault(Fault.DROP_AFTER_COMMIT, path_prefix="/v1/payment_intents")
    await stack.control.add_fault(
        Fault.ERROR_500_AFTER_COMMIT, path_prefix="/v1/refunds", times=None
    )
    # ... and the refunds cannot be read back: nothing can tell whether it happened.
    await stack.control.add_fault(
        Fault.ERROR_503, method="GET", path_prefix="/v1/refunds", times=None
    )
    tenant, auth = await stack.new_agent(tools=("charge_payment", "refund_payment"))
    key = f"agent-call-{uuid.uuid4().hex}"
    body = {
        "steps": [
            {"step_id": "pay", "tool": "charge_payment", "arguments": VISA_CHARGE},
            {
                "step_id": "refund",
                "tool": "refund_payment",
                "arguments": {"charge_step": "pay", "amount": 1000},
            },
        ],
        "budget": FAST_BUDGET.model_dump(mode="json"),
    }
    try:
        answer = await http.post(
            f"{stack.gateway_url}/v1/tasks",
            json=body,
            headers={**auth, "Idempotency-Key": key},
        )
        assert answer.status_code == 202, answer.text
        task_id = answer.json()["task_id"]
        parked = await stack.wait_for_state(task_id, lambda s: s.state is TaskState.PARKED)
    finally:
        await stack.control.clear_faults()
    assert [a.outcome for a in parked.step("pay").attempts] == [
        OutcomeClass.UNKNOWN,
        OutcomeClass.SUCCEEDED,
    ]
    # The refund's 500 is stored under its key: one same-key repeat shows it replayed,
    # then the look-up, the park (#13); never the whole budget.
    assert len(parked.step("refund").attempts) == 2

    # While the task waits for a person, every attempt is already exported (the gateway's
    # spans arrive on the gateway's own schedule: wait for both).
    spans = await stack.otlp.wait_for_spans(
        lambda spans: (
            bool(attempts_of(spans, task_id, "look_up_refund_payment"))
            and gateway_request_arrived(spans, tenant)
        )
    )
    [request] = [
        s for s in spans if s.name == "tasks.create" and s.attributes["onceflow.tenant"] == tenant
    ]
    trace_id = request.trace_id
    [root] = [s for s in spans if s.trace_id == trace_id and not s.parent_span_id]
    assert (root.name, root.service) == ("POST /v1/tasks", "onceflow-gateway")
    assert request.service == "onceflow-gateway"
    assert request.attributes["onceflow.key_digest"] == key_digest(key)
    assert request.attributes["onceflow.principal"] == "agent-1"
    assert request.attributes["onceflow.scope"] == f"{tenant}:agent-1:task:create"
    assert request.attributes["onceflow.tools"] == ["charge_payment", "refund_payment"]
    assert request.attributes["onceflow.workflow_id"] == task_id
    described = await stack.client.get_workflow_handle(task_id).describe()
    assert (await described.memo())[TRACE_ID_MEMO] == trace_id

    charges = attempts_of(spans, task_id, "charge_payment")
    refunds = attempts_of(spans, task_id, "refund_payment")
    lookups = attempts_of(spans, task_id, "look_up_refund_payment")
    assert [s.attributes["onceflow.outcome"] for s in charges] == ["unknown", "succeeded"]
    assert [s.attributes["onceflow.outcome"] for s in refunds] == ["unknown", "unknown"]
    assert [s.attributes["onceflow.attempt"] for s in [*charges, *refunds]] == [1, 2, 1, 2]
    for attempt in [*charges, *refunds, *lookups]:
        assert attempt.trace_id == trace_id
        assert attempt.service == "onceflow-worker"
        assert attempt.attributes["onceflow.tenant"] == tenant
        assert attempt.attributes["onceflow.workflow_id"] == task_id
        assert attempt.attributes["onceflow.child_key_digest"].startswith("sha256:")
    assert {s.attributes["onceflow.step"] for s in charges} == {"pay"}
    assert {s.attributes["onceflow.step"] for s in refunds} == {"refund"}

    # Each attempt's provider call is its child, with the provider's correlation ids.
    [lost] = children(spans, charges[0])
    [replayed] = children(spans, charges[1])
    assert lost.name == replayed.name == "stripe POST /v1/payment_intents"
    assert lost.kind == SpanKind.CLIENT.value + 1
    assert lost.attributes["onceflow.outcome"] == "unknown"
    assert "stripe.request_id" not in lost.attributes  # the answer never arrived
    assert replayed.attributes["stripe.idempotent_replayed"] is True
    payment_intent = parked.step("pay").resource_id
    assert replayed.attributes["stripe.payment_intent"] == payment_intent
    assert charges[1].attributes["onceflow.resource_id"] == payment_intent
    assert replayed.attributes["stripe.request_id"].startswith("req_")
    assert (
        lost.attributes["onceflow.child_key_digest"]
        == replayed.attributes["onceflow.child_key_digest"]
        == charges[0].attributes["onceflow.child_key_digest"]
    )
    for refund in refunds:
        [call] = [s for s in children(spans, refund) if s.name == "stripe POST /v1/refunds"]
        assert call.attributes["http.response.status_code"] == 500
        assert call.attributes["stripe.request_id"].startswith("req_")
        assert call.attributes["stripe.payment_intent"] == payment_intent
    # The repeat's 500 was replayed (stored): the attempt listed the refunds to find it.
    [listed] = [s for s in children(spans, refunds[1]) if s.name == "stripe GET /v1/refunds"]
    assert listed.attributes["http.response.status_code"] == 503

    # While it waits, the worker's visibility scan reports it in the parked-task gauges.
    def parked_gauges_show_it() -> bool:
        return any(v > 0 for _, v in stack.otlp.metric_points("onceflow_parked_tasks")) and any(
            v > 0 for _, v in stack.otlp.metric_points("onceflow_oldest_parked_task_age_seconds")
        )

    await stack.otlp.wait_for_spans(lambda _: parked_gauges_show_it())

    # The operator reconciles through the gateway; the task ends inside the same trace.
    [refunded] = [
        entry
        for entry in await stack.control.ledger()
        if entry.kind == "refund" and entry.payment_intent == payment_intent
    ]
    decided = await http.post(
        f"{stack.gateway_url}/v1/tasks/{task_id}/reconcile",
        json={
            "step_id": "refund",
            "decision": "happened",
            "resource_id": refunded.object_id,
            "reason": "refund seen in the provider's dashboard",
        },
        headers=auth,
    )
    assert decided.status_code == 200, decided.text
    final = await stack.tasks.result(task_id)
    assert final.state is TaskState.SUCCEEDED
    # The gateway and the worker export on their own schedules: wait for both.
    spans = await stack.otlp.wait_for_spans(
        lambda spans: (
            bool(attempts_of(spans, task_id, "record_task_outcome"))
            and any(
                s.name == "tasks.reconcile" and s.attributes.get("onceflow.workflow_id") == task_id
                for s in spans
            )
        )
    )
    [decision] = [
        s
        for s in spans
        if s.name == "tasks.reconcile" and s.attributes.get("onceflow.workflow_id") == task_id
    ]
    [handled] = [
        s
        for s in spans
        if s.name == "HandleUpdate:reconcile" and s.attributes["temporalWorkflowID"] == task_id
    ]
    assert handled.trace_id == trace_id
    assert decision.trace_id in handled.links  # the decision's own trace links to the task's
    assert attempts_of(spans, task_id, "record_task_outcome")[0].trace_id == trace_id

    # Replaying the task's real history (tracing headers included) emits no span at all
    # (tests/workflows/test_replay.py does the same for the saved histories).
    history = await stack.client.get_workflow_handle(task_id).fetch_history()
    assert await spans_emitted_by_replay(history) == []

    # The counters came from the workflow through Temporal's metric buffer, over OTLP.
    def total(name: str, **match: str) -> float:
        points = stack.otlp.metric_points(name)
        latest: dict[tuple[tuple[str, object], ...], float] = {}
        for attributes, value in points:
            if all(attributes.get(k) == v for k, v in match.items()):
                latest[tuple(sorted(attributes.items()))] = value
        return sum(latest.values())

    def paged_on() -> bool:
        # Temporal's runtime buffers metrics before they are drained and exported.
        return (
            total("onceflow_attempts", tool="refund_payment", outcome="unknown") >= 1
            and total("onceflow_attempts", tool="charge_payment", outcome="succeeded") >= 1
            and total("onceflow_tasks_parked", tool="refund_payment") >= 1
            and total("onceflow_key_unusable", tool="refund_payment", why="stored_failure") >= 1
            and any(v > 0 for _, v in stack.otlp.metric_points("onceflow_parked_tasks"))
            and any(
                v > 0
                for _, v in stack.otlp.metric_points("onceflow_oldest_parked_task_age_seconds")
            )
            # Stripe's state across the fleet, from the workers' reading of its budget.
            and any(
                attributes.get("provider") == "stripe" and value == 1
                for attributes, value in stack.otlp.metric_points("onceflow_provider_state")
            )
        )

    await stack.otlp.wait_for_spans(lambda _: paged_on())
