"""With payload keys configured, a task's customer data is encrypted in Temporal's history.

A task comes in through the gateway (its encrypting client), runs on the encrypting
worker, charges the customer at the Stripe-compatible provider and waits for an
operator's approval of the refund. Its history, as ``temporal workflow show`` prints it,
holds no customer id anywhere, yet its summary and memo stay readable; the operator's
approval (an Update) goes through, the refund happens once at the provider, the history
replays with the keys and fails to decode without them, and the Temporal CLI reads it
through the gateway's codec endpoint with an operator's key. ``onceflow status`` reads it
with the keys and stops with one line and exit code 2 without them.
"""

import asyncio
import base64
import json
import os
import sys
import uuid
from typing import Any

import httpx
from pydantic import SecretStr
from temporalio.worker import Replayer

from onceflow.encryption import (
    PayloadEncryptionSettings,
    UnknownEncryptionKey,
)
from onceflow.idempotency import REQUEST_HASH_MEMO
from onceflow.plugin import OnceflowPlugin
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.task_models import TaskState
from tests.gateway.conftest import Caller, make_caller, new_tenant
from tests.harness import HANG_SECONDS, REPO, wait_for
from tests.payments.conftest import FAST_BUDGET

from .conftest import KEY, KEY_ID, KEYS, EncryptedStack, order_task, readable_text

TEMPORAL = REPO / ".venv" / "bin" / "temporal"
ENCRYPTED = base64.b64encode(b"binary/encrypted").decode()


async def test_an_encrypted_task_runs_is_approved_and_replays_only_with_the_key(
    stack: EncryptedStack, database: str
) -> None:
    tenant = new_tenant()
    customer_id = f"ann.lee.{uuid.uuid4().hex[:8]}"
    stripe_customer = f"cus_AnnLee{uuid.uuid4().hex[:8]}"
    order_id = f"ord-{uuid.uuid4().hex[:8]}"
    agent = await make_caller(
        database, tenant=tenant, tools=("create_order", "charge_payment", "refund_payment")
    )
    operator = await make_caller(database, tenant=tenant, name="ops", may_decide=True)
    async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=HANG_SECONDS) as http:
        started = await http.post(
            "/v1/tasks",
            json={
                "steps": [
                    {
                        "step_id": "order",
                        "tool": "create_order",
                        "arguments": {
                            "customer_id": customer_id,
                            "currency": "eur",
                            "lines": [{"sku": "mug", "quantity": 1, "unit_price_cents": 4200}],
                        },
                    },
                    {
                        "step_id": "pay",
                        "tool": "charge_payment",
                        "arguments": {
                            "amount": 4200,
                            "currency": "eur",
                            "customer": stripe_customer,
                            "payment_method": "pm_card_visa",
                            "order_id": order_id,
                        },
                    },
                    {
                        "step_id": "refund",
                        "tool": "refund_payment",
                        "arguments": {"charge_step": "pay"},
                    },
                ],
                "budget": FAST_BUDGET.model_dump(mode="json"),
            },
            headers={**agent.headers, "Idempotency-Key": uuid.uuid4().hex},
        )
        assert started.status_code < 300, started.text
        task_id = started.json()["task_id"]
        waiting = await wait_for(
            stack.tasks, task_id, lambda status: status.state is TaskState.AWAITING_APPROVAL
        )

        # What Temporal holds: no customer id in any payload, summary and memo readable.
        stored = await _workflow_show(stack, task_id)
        seen = readable_text(stored)
        assert customer_id not in seen and stripe_customer not in seen and order_id not in seen
        [started_event] = [
            e for e in stored["events"] if "workflowExecutionStartedEventAttributes" in e
        ]
        attributes = started_event["workflowExecutionStartedEventAttributes"]
        assert attributes["input"]["payloads"][0]["metadata"]["encoding"] == ENCRYPTED
        assert _text(started_event["userMetadata"]["summary"]["data"]) == json.dumps(
            f"{tenant}: create_order, charge_payment, refund_payment"
        )
        fingerprint = attributes["memo"]["fields"][REQUEST_HASH_MEMO]
        assert json.loads(_text(fingerprint["data"])).startswith("v1:")

        # The operator's decision is an Update through the gateway's encrypting client; a
        # refusal's reason (an encrypted failure message) comes back readable.
        decision = {"step_id": "refund", "approved": True, "reason": "customer asked"}
        stale = await http.post(
            f"/v1/tasks/{task_id}/approve",
            json={**decision, "arguments_digest": "sha256:" + "0" * 64},
            headers=operator.headers,
        )
        assert stale.status_code == 409, stale.text
        assert stale.json()["detail"].startswith("the approval is for other arguments")
        approved = await http.post(
            f"/v1/tasks/{task_id}/approve",
            json={**decision, "arguments_digest": waiting.step("refund").arguments_digest},
            headers=operator.headers,
        )
        assert approved.status_code == 200, approved.text
    done = await wait_for(stack.tasks, task_id, lambda status: status.state is TaskState.SUCCEEDED)
    assert [step.state.value for step in done.steps] == ["succeeded"] * 3
    ledger = await stack.provider.ledger()
    [charge] = [entry for entry in ledger if entry.metadata.get("order_id") == order_id]
    moved = [entry.kind for entry in ledger if entry.payment_intent == charge.object_id]
    assert sorted(moved) == ["charge", "refund"]

    # The history replays with the keys; without the one it names, it cannot be decoded.
    history = await stack.client.get_workflow_handle(task_id).fetch_history()
    with_key = Replayer(
        workflows=[],
        plugins=[
            OnceflowPlugin(
                workflows=[AgentTaskWorkflow],
                encryption=PayloadEncryptionSettings(payload_keys=(SecretStr(KEYS),)),
                strict_sandbox=True,
            )
        ],
    )
    assert (
        await with_key.replay_workflow(history, raise_on_replay_failure=False)
    ).replay_failure is None
    other_key = base64.b64encode(bytes(32)).decode()
    without_key = Replayer(
        workflows=[],
        plugins=[
            OnceflowPlugin(
                workflows=[AgentTaskWorkflow],
                encryption=PayloadEncryptionSettings(
                    payload_keys=(SecretStr(f"k-other:{other_key}"),)
                ),
                strict_sandbox=True,
            )
        ],
    )
    result = await without_key.replay_workflow(history, raise_on_replay_failure=False)
    # The activation fails with the codec's error (its message, encrypted like every
    # failure message, names the key id in the worker's log).
    assert UnknownEncryptionKey.__name__ in str(result.replay_failure)
    assert KEY not in str(result.replay_failure) and other_key not in str(result.replay_failure)

    # The Temporal CLI reads it through the codec endpoint, with an operator's key only.
    decoded = readable_text(await _workflow_show(stack, task_id, codec=operator))
    assert customer_id in decoded and stripe_customer in decoded


async def test_the_cli_reads_an_encrypted_task_with_the_keys_and_says_what_is_missing(
    stack: EncryptedStack,
) -> None:
    customer_id = f"bo.kim.{uuid.uuid4().hex[:8]}"
    task_id = await order_task(stack, customer_id, tenant=new_tenant(), prefix="enc-cli")

    code, out, err = await _onceflow(stack, "status", task_id, "--json", keys=KEYS)
    assert code == 0, err
    assert json.loads(out)["steps"][0]["arguments"]["customer_id"] == customer_id

    code, out, err = await _onceflow(stack, "status", task_id, "--json", keys=None)
    assert code == 2 and customer_id not in out + err
    assert err.strip().splitlines() == [
        "error: the task's payloads are encrypted and this command has no key; fix: set "
        "ONCEFLOW_PAYLOAD_KEYS to the keys the workers use"
    ]

    other = f"k-other:{base64.b64encode(bytes(32)).decode()}"
    code, out, err = await _onceflow(stack, "status", task_id, "--json", keys=other)
    assert code == 2 and customer_id not in out + err
    [line] = err.strip().splitlines()
    assert f"key id {KEY_ID!r}" in line and KEY not in line


async def _workflow_show(
    stack: EncryptedStack, task_id: str, *, codec: Caller | None = None
) -> Any:
    """``temporal workflow show --output json``, through the codec endpoint with ``codec``'s
    key when given. Run without blocking: the codec endpoint is served by this loop."""
    arguments = [
        str(TEMPORAL),
        "workflow",
        "show",
        "--address",
        stack.temporal_address,
        "--workflow-id",
        task_id,
        "--output",
        "json",
    ]
    if codec is not None:
        arguments += [
            "--codec-endpoint",
            stack.codec_endpoint,
            "--codec-auth",
            f"Bearer {codec.api_key}",
        ]
    process = await asyncio.create_subprocess_exec(
        *arguments, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, err.decode()
    return json.loads(out)


async def _onceflow(
    stack: EncryptedStack, *arguments: str, keys: str | None
) -> tuple[int, str, str]:
    environment = {
        name: value for name, value in os.environ.items() if not name.startswith("ONCEFLOW_")
    }
    environment["TEMPORAL_ADDRESS"] = stack.temporal_address
    if keys is not None:
        environment["ONCEFLOW_PAYLOAD_KEYS"] = keys
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "onceflow.cli",
        *arguments,
        cwd=REPO,
        env=environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def _text(encoded: str) -> str:
    return base64.b64decode(encoded).decode()
