"""Planted secrets never reach a span, a log record or a task's history in the UI.

The requests carry a raw idempotency key, a card number (in an argument, and as a key),
the caller's API key and a Stripe-shaped secret; the worker holds a Stripe secret key.
Every sink an operator or a telemetry backend sees is searched byte for byte: each OTLP
export as it crossed the wire, every line the worker and gateway processes logged, and
every workflow history (all payloads, memo, search attributes, summaries) of the tenant.
"""

import json
import uuid

import httpx
from onceflow_devstack.stripe_provider import Fault
from temporalio.api.history.v1 import History

from onceflow.tools.worker import key_digest
from onceflow.workflows.task_models import TaskState
from tests.payments.conftest import VISA_CHARGE

from .conftest import PLANTED_STRIPE_KEY, TelemetryStack

CARD = "4242424242424242"
CARD_SPACED = "4242 4242 4242 4242"
STRIPE_SHAPED = "sk_live_PLANTEDinARGUMENTS7d2e"


async def test_planted_keys_cards_and_secrets_appear_in_no_span_log_or_history(
    stack: TelemetryStack, http: httpx.AsyncClient
) -> None:
    tenant, auth = await stack.new_agent(tools=("charge_payment",))
    api_key = auth["Authorization"].removeprefix("Bearer ")
    raw_key = f"raw-key-PLANTED-{uuid.uuid4().hex[:12]}"
    calls = f"{stack.gateway_url}/v1/tools/charge_payment/calls"

    # A card number or a credential in the arguments is refused before anything is
    # reserved (by the card and secret scan, which runs before the fields' own patterns),
    # and the refusal names only where it was.
    for planted, reason in (
        (CARD, "looks like a card number"),
        (CARD_SPACED, "looks like a card number"),
        (STRIPE_SHAPED, "looks like a secret"),
    ):
        refused = await http.post(
            calls,
            json={**VISA_CHARGE, "order_id": planted},
            headers={**auth, "Idempotency-Key": raw_key},
        )
        assert refused.status_code == 400, refused.text
        [problem] = refused.json()["errors"]
        assert problem["loc"] == ["order_id"]
        assert problem["msg"].startswith(reason)
        assert planted not in refused.text

    # The same raw key with a clean body then charges once, its response lost on the way;
    # and a card number sent as an idempotency key is only ever used as a digest.
    await stack.control.add_fault(Fault.DROP_AFTER_COMMIT, path_prefix="/v1/payment_intents")
    answers = [
        await http.post(calls, json=VISA_CHARGE, headers={**auth, "Idempotency-Key": raw_key}),
        await http.post(
            calls,
            json={**VISA_CHARGE, "order_id": "ord-1002"},
            headers={**auth, "Idempotency-Key": CARD},
        ),
    ]
    task_ids = [answer.json()["task_id"] for answer in answers]
    for task_id in task_ids:
        assert (await stack.tasks.result(task_id)).state is TaskState.SUCCEEDED

    # Every span, metric and log line the processes produced so far has arrived: the scans
    # below see everything, not only what happened to be exported by now.
    await stack.caught_up()
    planted = [raw_key, CARD, CARD_SPACED, STRIPE_SHAPED, api_key, PLANTED_STRIPE_KEY]

    exports = stack.otlp.raw_exports()
    assert exports
    for export in exports:
        for secret in planted:
            assert secret.encode() not in export
    logs = stack.logs()
    for secret in planted:
        assert secret not in logs
    histories = [
        await stack.client.get_workflow_handle(execution.id).fetch_history()
        async for execution in stack.client.list_workflows(f"OnceflowTenant = '{tenant}'")
    ]
    assert len(histories) == 2
    for history in histories:
        raw = History(events=history.events).SerializeToString()
        shown = history.to_json()
        for secret in planted:
            assert secret.encode() not in raw
            assert secret not in shown

    # What is there instead: digests and correlation ids, as structured JSON log fields.
    spans = stack.otlp.spans()
    digests = {
        s.attributes.get("onceflow.key_digest")
        for s in spans
        if s.name == "tools.call charge_payment"
    }
    assert {key_digest(raw_key), key_digest(CARD)} <= digests
    records = [line for line in logs.splitlines() if line.startswith("{")]
    attempts = [
        record
        for record in map(json.loads, records)
        if record["logger"] == "onceflow.attempts"
        and record.get("onceflow.workflow_id") in task_ids
    ]
    assert [
        a["onceflow.outcome"] for a in attempts if a["onceflow.workflow_id"] == task_ids[0]
    ] == ["unknown", "succeeded"]
    assert all(len(record["trace_id"]) == 32 for record in attempts)
    assert all(record["onceflow.child_key_digest"].startswith("sha256:") for record in attempts)
