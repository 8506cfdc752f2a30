"""Open tasks over HTTP on the embedded stack: two gateway processes, one worker running
the built-in tools, the local Stripe-compatible provider, real Temporal and PostgreSQL.

An agent creates an open task (``POST /v1/tasks`` with ``open``), sends its model's tool
calls one by one (``POST /v1/tasks/{id}/calls``, a key per call) and closes it. Each test
judges by the far sides' records: the provider's ledger for charges and refunds, the
orders and coupon tables, the idempotency records and the task workflows in Temporal.
"""

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from onceflow_devstack.stripe_provider import Fault

from onceflow.tools.worker import key_digest
from tests.harness import eventually

from ..conftest import (
    Caller,
    GatewayProcess,
    Stack,
    StripeProvider,
    count,
    make_caller,
    new_tenant,
    open_service,
    rows,
    start_gateway,
)
from .conftest import TOOLS

PROBLEM = "application/problem+json"
COUPON = {"user_id": "u-1", "coupon_id": "LATE"}


def keyed(caller: Caller, key: str) -> dict[str, str]:
    return {**caller.headers, "Idempotency-Key": key}


def charge(order_id: str, amount: int = 4200) -> dict[str, Any]:
    return {
        "amount": amount,
        "currency": "eur",
        "customer": "cus_alice",
        "payment_method": "pm_card_visa",
        "order_id": order_id,
    }


def order(customer_id: str, quantity: int = 1) -> dict[str, Any]:
    return {
        "customer_id": customer_id,
        "currency": "eur",
        "lines": [{"sku": "mug", "quantity": quantity, "unit_price_cents": 1250}],
    }


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def open_task(
    http: httpx.AsyncClient, gateway: GatewayProcess, caller: Caller, **open: Any
) -> str:
    created = await http.post(
        f"{gateway.url}/v1/tasks",
        json={"open": open},
        headers=keyed(caller, unique("open")),
    )
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["open"] is True and body["state"] == "running" and body["steps"] == []
    assert created.headers["Location"] == f"/v1/tasks/{body['task_id']}"
    return str(body["task_id"])


async def call(
    http: httpx.AsyncClient,
    gateway: GatewayProcess,
    caller: Caller,
    task_id: str,
    key: str,
    tool: str,
    arguments: dict[str, Any],
    **more: Any,
) -> httpx.Response:
    params = {"wait": more.pop("wait")} if "wait" in more else None
    return await http.post(
        f"{gateway.url}/v1/tasks/{task_id}/calls",
        json={"tool": tool, "arguments": arguments, **more},
        headers=keyed(caller, key),
        params=params,
    )


async def status(
    http: httpx.AsyncClient, gateway: GatewayProcess, caller: Caller, task_id: str
) -> dict[str, Any]:
    response = await http.get(f"{gateway.url}/v1/tasks/{task_id}", headers=caller.headers)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def test_an_agent_loop_across_the_reference_tools_is_one_task_with_one_budget(
    stack: Stack,
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
    stripe_provider: StripeProvider,
) -> None:
    create_key = unique("open")
    created = await http.post(
        f"{gateways[0].url}/v1/tasks",
        json={"open": {"idle_timeout": "PT30M", "max_lifetime": "P1D"}},
        headers=keyed(agent, create_key),
    )
    assert created.status_code == 201, created.text
    task_id = created.json()["task_id"]
    # The same key for the same request is the same task, not a second one.
    again = await http.post(
        f"{gateways[1].url}/v1/tasks",
        json={"open": {"idle_timeout": "PT30M", "max_lifetime": "P1D"}},
        headers=keyed(agent, create_key),
    )
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["task_id"] == task_id

    orders = [unique("ord") for _ in range(3)]
    loop = [
        ("issue_coupon", {"user_id": "u-1", "coupon_id": "WELCOME10"}),
        ("create_order", order("c-1")),
        ("charge_payment", charge(orders[0])),
        ("create_order", order("c-2", quantity=2)),
        ("charge_payment", charge(orders[1], amount=2500)),
        ("issue_coupon", {"user_id": "u-2", "coupon_id": "WELCOME10"}),
        ("charge_payment", charge(orders[2], amount=990)),
    ]
    answers = []
    for index, (tool, arguments) in enumerate(loop):
        # The model's calls alternate between the two gateways, as behind a balancer.
        response = await call(
            http, gateways[index % 2], agent, task_id, unique("call"), tool, arguments
        )
        assert response.status_code == 200, response.text
        assert "Idempotent-Replayed" not in response.headers
        answers.append(response.json())

    assert [(a["tool"], a["state"], a["ended"]) for a in answers] == [
        (tool, "succeeded", True) for tool, _ in loop
    ]
    assert all(a["task_id"] == task_id and a["repeat_of"] is None for a in answers)
    assert all(a["step_id"].startswith("key-") for a in answers), "ids derived from keys"
    assert len({a["step_id"] for a in answers}) == len(loop)

    listed = await status(http, gateways[1], agent, task_id)
    assert listed["open"] is True and listed["closing"] is None
    assert [step["step_id"] for step in listed["steps"]] == [a["step_id"] for a in answers]
    assert listed["budget"]["attempts_used"] == 0

    # The far sides: one effect per call.
    assert count(database, "coupon_issuances") == 2
    assert count(database, "orders") == 2
    for order_id in orders:
        assert len(await stripe_provider.charges(order_id)) == 1
    charged = {a["resource_id"] for a in answers if a["tool"] == "charge_payment"}
    assert charged == {
        entry.object_id for order_id in orders for entry in await stripe_provider.charges(order_id)
    }
    assert await stack.task_workflows(agent.principal.tenant) == 1

    closed = await http.post(f"{gateways[0].url}/v1/tasks/{task_id}/close", headers=agent.headers)
    assert closed.status_code == 200, closed.text
    assert closed.json()["closing"] == "closed by the agent"
    final = await eventually(
        lambda: status(http, gateways[0], agent, task_id),
        until=lambda current: current["state"] == "closed",
        what="the open task ends closed once the agent closed it",
    )
    assert len(final["steps"]) == len(loop)
    # The workflow stored its final view for the key that created it...
    await eventually(
        lambda: rows(
            database, "SELECT state FROM idempotency_records WHERE workflow_id = %s", task_id
        ),
        until=lambda found: found == [("succeeded",)],
        what="the closed task's outcome reaches its creation's record",
    )
    # ...which the creation's key answers with from now on.
    replay = await eventually(
        lambda: http.post(
            f"{gateways[1].url}/v1/tasks",
            json={"open": {"idle_timeout": "PT30M", "max_lifetime": "P1D"}},
            headers=keyed(agent, create_key),
        ),
        until=lambda response: response.status_code == 200,
        what="the creation's key answers with the closed task's stored view",
    )
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json()["state"] == "closed" and len(replay.json()["steps"]) == len(loop)
    assert rows(
        database,
        "SELECT state FROM idempotency_records WHERE workflow_id = %s",
        task_id,
    ) == [("succeeded",)]
    assert await stack.task_workflows(agent.principal.tenant) == 1


async def test_the_model_repeating_a_call_under_a_new_key_makes_one_effect_unless_deliberate(
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
    stripe_provider: StripeProvider,
) -> None:
    task_id = await open_task(http, gateways[0], agent)
    order_id = unique("ord")

    first = await call(
        http, gateways[0], agent, task_id, unique("k"), "charge_payment", charge(order_id)
    )
    assert first.status_code == 200, first.text
    # The model picks the same charge again: a new tool call, so a new key.
    repeated = await call(
        http, gateways[1], agent, task_id, unique("k"), "charge_payment", charge(order_id)
    )
    assert repeated.status_code == 200, repeated.text
    charged, answered = first.json(), repeated.json()
    assert answered["repeat_of"] == charged["step_id"]
    assert answered["step_id"] != charged["step_id"]
    assert answered["state"] == "succeeded" and answered["attempts"] == 0
    assert answered["resource_id"] == charged["resource_id"]
    assert answered["result"] == charged["result"]
    assert len(await stripe_provider.charges(order_id)) == 1, "one PaymentIntent"

    # Orders too: the same order chosen twice is one order.
    made = await call(http, gateways[0], agent, task_id, unique("k"), "create_order", order("c-9"))
    again = await call(http, gateways[1], agent, task_id, unique("k"), "create_order", order("c-9"))
    assert again.json()["repeat_of"] == made.json()["step_id"]
    assert count(database, "orders") == 1

    # A second identical charge on purpose runs, and is recorded as such.
    deliberate = await call(
        http,
        gateways[0],
        agent,
        task_id,
        unique("k"),
        "charge_payment",
        charge(order_id),
        deliberate_repeat=True,
    )
    assert deliberate.status_code == 200, deliberate.text
    second = deliberate.json()
    assert second["repeat_of"] is None and second["deliberate_repeat"] is True
    assert second["resource_id"] != charged["resource_id"]
    ledger = await stripe_provider.charges(order_id)
    assert sorted(entry.object_id for entry in ledger) == sorted(
        [charged["resource_id"], second["resource_id"]]
    )

    listed = await status(http, gateways[1], agent, task_id)
    assert [(s["step_id"], s["repeat_of"], s["deliberate_repeat"]) for s in listed["steps"]] == [
        (charged["step_id"], None, False),
        (answered["step_id"], charged["step_id"], False),
        (made.json()["step_id"], None, False),
        (again.json()["step_id"], made.json()["step_id"], False),
        (second["step_id"], None, True),
    ]


async def test_a_resent_call_whose_answer_was_lost_is_the_same_call(
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
    stripe_provider: StripeProvider,
) -> None:
    task_id = await open_task(http, gateways[0], agent)
    order_id = unique("ord")
    key = unique("charge")
    url = f"{gateways[0].url}/v1/tasks/{task_id}/calls"
    body = {"tool": "charge_payment", "arguments": charge(order_id)}

    scope = f"{agent.principal.tenant}:{agent.principal.name}:task:call"
    # The agent's request reaches the gateway (its key is claimed), then the agent loses
    # the connection before any answer comes...
    lost = asyncio.create_task(http.post(url, json=body, headers=keyed(agent, key)))
    await eventually(
        lambda: rows(database, "SELECT 1 FROM idempotency_records WHERE scope = %s", scope),
        what="the first request claimed its key",
    )
    lost.cancel()
    # ...and sends it again with the same key, on another gateway, until it is answered.
    resent = await eventually(
        lambda: http.post(
            f"{gateways[1].url}/v1/tasks/{task_id}/calls", json=body, headers=keyed(agent, key)
        ),
        until=lambda response: response.status_code != 409,
        what="the resend is answered once the first request has its answer",
    )
    assert resent.status_code == 200, resent.text
    assert resent.json()["state"] == "succeeded"
    # Once more, after it was answered: the stored answer, byte for byte.
    replayed = await http.post(url, json=body, headers=keyed(agent, key))
    assert replayed.status_code == 200
    assert replayed.headers["Idempotent-Replayed"] == "true"
    assert replayed.content == resent.content
    # The replay points at the call's task, which answers there.
    assert replayed.headers["Content-Location"] == resent.headers["Content-Location"]
    assert replayed.headers["Content-Location"] == f"/v1/tasks/{task_id}"
    there = await http.get(
        f"{gateways[1].url}{replayed.headers['Content-Location']}", headers=agent.headers
    )
    assert there.status_code == 200 and there.json()["workflow_id"] == task_id

    listed = await status(http, gateways[0], agent, task_id)
    assert [step["step_id"] for step in listed["steps"]] == [resent.json()["step_id"]]
    assert [step["repeat_of"] for step in listed["steps"]] == [None], "not a repeat: one call"
    assert len(await stripe_provider.charges(order_id)) == 1
    assert rows(
        database,
        "SELECT state, status_code, resource_id FROM idempotency_records WHERE scope = %s",
        scope,
    ) == [("succeeded", 200, task_id)]
    for gateway in gateways:
        assert key not in gateway.log(), "the raw key is never logged"
    assert any(key_digest(key) in gateway.log() for gateway in gateways)


async def test_the_same_key_for_another_call_is_refused_and_records_nothing(
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
) -> None:
    task_id = await open_task(http, gateways[0], agent)
    other_task = await open_task(http, gateways[0], agent)
    key = unique("order")
    first = await call(http, gateways[0], agent, task_id, key, "create_order", order("c-1"))
    assert first.status_code == 200, first.text
    record = "SELECT request_hash, state, response_body, updated_at FROM idempotency_records"
    before = rows(database, f"{record} WHERE resource_id = %s", task_id)

    refused = [
        # Another order under the key.
        await call(http, gateways[1], agent, task_id, key, "create_order", order("c-2")),
        # Another tool.
        await call(
            http,
            gateways[0],
            agent,
            task_id,
            key,
            "issue_coupon",
            {"user_id": "u-1", "coupon_id": "W"},
        ),
        # The same call, but on purpose a second time.
        await call(
            http,
            gateways[1],
            agent,
            task_id,
            key,
            "create_order",
            order("c-1"),
            deliberate_repeat=True,
        ),
        # The same call in another task.
        await call(http, gateways[0], agent, other_task, key, "create_order", order("c-1")),
    ]
    for response in refused:
        assert response.status_code == 422, response.text
        assert response.headers["content-type"].startswith(PROBLEM)
        assert response.json()["type"] == "urn:onceflow:problem:idempotency-key-reused"
        assert key not in response.text

    assert rows(database, f"{record} WHERE resource_id = %s", task_id) == before
    assert not rows(database, f"{record} WHERE resource_id = %s", other_task)
    assert count(database, "orders") == 1
    assert count(database, "coupon_issuances") == 0
    assert len((await status(http, gateways[0], agent, task_id))["steps"]) == 1
    assert (await status(http, gateways[0], agent, other_task))["steps"] == []


async def test_refusals_say_why_are_kept_for_their_key_and_do_not_block_a_new_key(
    stack: Stack,
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
) -> None:
    task_id = await open_task(http, gateways[0], agent)
    made = await call(
        http, gateways[0], agent, task_id, unique("k"), "create_order", order("c-1"), call_id="c1"
    )
    assert made.status_code == 200 and made.json()["step_id"] == "c1"

    # The agent reuses its call id for another call: the task refuses it, with its reason.
    key = unique("k")
    reused = await call(
        http, gateways[1], agent, task_id, key, "create_order", order("c-2"), call_id="c1"
    )
    assert reused.status_code == 409, reused.text
    problem = reused.json()
    assert problem["type"] == "urn:onceflow:problem:call-refused"
    assert "was used for another call" in problem["reason"]
    assert problem["task_id"] == task_id
    # The key keeps the refusal...
    again = await call(
        http, gateways[0], agent, task_id, key, "create_order", order("c-2"), call_id="c1"
    )
    assert again.status_code == 409 and again.headers["Idempotent-Replayed"] == "true"
    assert again.content == reused.content
    # ...and a corrected call under a new key is not blocked by it.
    corrected = await call(
        http, gateways[1], agent, task_id, unique("k"), "create_order", order("c-2"), call_id="c2"
    )
    assert corrected.status_code == 200, corrected.text
    assert count(database, "orders") == 2

    closed = await http.post(f"{gateways[0].url}/v1/tasks/{task_id}/close", headers=agent.headers)
    assert closed.status_code == 200, closed.text
    after = await call(http, gateways[1], agent, task_id, unique("k"), "issue_coupon", COUPON)
    assert after.status_code == 409, after.text
    assert after.json()["type"] == "urn:onceflow:problem:call-refused"
    assert "no more calls" in after.json()["reason"]
    await eventually(
        lambda: status(http, gateways[0], agent, task_id),
        until=lambda current: current["state"] == "closed",
        what="the task ends closed",
    )
    ended = await call(http, gateways[0], agent, task_id, unique("k"), "issue_coupon", COUPON)
    assert ended.status_code == 409, ended.text
    assert "ended" in ended.json()["reason"]
    # Closing again answers with the task's status, whatever it is now.
    reclosed = await http.post(f"{gateways[1].url}/v1/tasks/{task_id}/close", headers=agent.headers)
    assert reclosed.status_code == 200 and reclosed.json()["state"] == "closed"
    assert count(database, "coupon_issuances") == 0
    assert [s["step_id"] for s in (await status(http, gateways[0], agent, task_id))["steps"]] == [
        "c1",
        "c2",
    ]

    # A plan takes neither calls nor a close, and such a request reserves nothing.
    plan = await http.post(
        f"{gateways[0].url}/v1/tasks",
        json={"steps": [{"step_id": "1", "tool": "create_order", "arguments": order("c-3")}]},
        headers=keyed(agent, unique("plan")),
    )
    assert plan.status_code == 200, plan.text
    plan_id = plan.json()["task_id"]
    records = count(database, "idempotency_records")
    not_open = [
        await call(http, gateways[0], agent, plan_id, unique("k"), "create_order", order("c-4")),
        await http.post(f"{gateways[1].url}/v1/tasks/{plan_id}/close", headers=agent.headers),
    ]
    for response in not_open:
        assert response.status_code == 409, response.text
        assert response.json()["type"] == "urn:onceflow:problem:task-not-open"
    assert count(database, "idempotency_records") == records
    assert count(database, "orders") == 3

    # Another tenant's open task is not found, and a tool the caller may not use is 403.
    stranger = await make_caller(database, tenant=new_tenant(), tools=TOOLS)
    other = await open_task(http, gateways[0], stranger)
    foreign = await call(http, gateways[0], agent, other, unique("k"), "create_order", order("c"))
    assert foreign.status_code == 404
    limited = await make_caller(
        database, tenant=agent.principal.tenant, name="agent-2", tools=("issue_coupon",)
    )
    forbidden = await call(
        http, gateways[1], limited, task_id, unique("k"), "create_order", order("c")
    )
    assert forbidden.status_code == 403, forbidden.text
    assert count(database, "idempotency_records") == records + 1  # the stranger's task


async def test_an_awaiting_call_is_not_its_final_answer_and_the_waiting_request_gets_the_decision(
    stack: Stack,
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
    stripe_provider: StripeProvider,
) -> None:
    operator = await make_caller(
        database, tenant=agent.principal.tenant, name="ops", tools=(), may_decide=True
    )
    task_id = await open_task(http, gateways[0], agent)
    order_id = unique("ord")
    charged = await call(
        http,
        gateways[0],
        agent,
        task_id,
        unique("k"),
        "charge_payment",
        charge(order_id),
        call_id="charge-1",
    )
    assert charged.status_code == 200, charged.text

    # A full refund always needs a person's approval: the call answers at once, 202.
    key = unique("refund")
    refund = {"charge_step": "charge-1", "reason": "requested_by_customer"}
    waiting = await call(http, gateways[1], agent, task_id, key, "refund_payment", refund)
    assert waiting.status_code == 202, waiting.text
    assert waiting.json()["state"] == "awaiting_approval" and not waiting.json()["ended"]
    assert waiting.headers["Location"] == f"/v1/tasks/{task_id}"
    # Asking again (same key) is the same call, still waiting: not a stored final answer.
    asked = await call(http, gateways[0], agent, task_id, key, "refund_payment", refund)
    assert asked.status_code == 202 and asked.headers["Idempotent-Replayed"] == "true"
    assert asked.json()["step_id"] == waiting.json()["step_id"]
    step_id = waiting.json()["step_id"]
    async with open_service(stack, replay_wait_seconds=0.5) as short_wait:
        principal = await short_wait.authenticate(agent.api_key)
        request = {"tool": "refund_payment", "arguments": refund}
        # Waiting for the end is bounded: then the call's state, still awaiting.
        held_briefly = await short_wait.call_in_task(
            principal, task_id, request, key, wait_until_ended=True
        )
        assert held_briefly.status_code == 202 and held_briefly.replayed
        assert held_briefly.body["state"] == "awaiting_approval"
        # The model asks for the same refund again: the guard answers with the waiting one.
        twin_key = unique("refund")
        twin = await short_wait.call_in_task(
            principal, task_id, request, twin_key, wait_until_ended=True
        )
        assert twin.status_code == 202 and not twin.replayed
        assert twin.body["repeat_of"] == step_id and twin.body["state"] == "awaiting_approval"

    # The agent waits for the decision; a person approves meanwhile.
    held = asyncio.create_task(
        call(http, gateways[0], agent, task_id, key, "refund_payment", refund, wait="ended")
    )
    approved = await http.post(
        f"{gateways[1].url}/v1/tasks/{task_id}/approve",
        json={
            "step_id": step_id,
            "approved": True,
            "reason": "customer asked",
            "arguments_digest": waiting.json()["arguments_digest"],
        },
        headers=operator.headers,
    )
    assert approved.status_code == 200, approved.text
    decided = await held
    assert decided.status_code == 200, decided.text
    assert decided.json()["state"] == "succeeded" and decided.json()["ended"]
    assert decided.headers["Idempotent-Replayed"] == "true"

    # From now on the key answers with the stored final answer.
    final = await call(http, gateways[1], agent, task_id, key, "refund_payment", refund)
    assert final.status_code == 200 and final.content == decided.content
    # The twin's key is asked again only after the task closed: its call ended meanwhile,
    # and the closed task's status still says how.
    closed = await http.post(f"{gateways[0].url}/v1/tasks/{task_id}/close", headers=agent.headers)
    assert closed.status_code == 200, closed.text
    await eventually(
        lambda: status(http, gateways[0], agent, task_id),
        until=lambda current: current["state"] == "closed",
        what="the task ends closed",
    )
    repeated = await call(http, gateways[0], agent, task_id, twin_key, "refund_payment", refund)
    assert repeated.status_code == 200, repeated.text
    assert repeated.json()["repeat_of"] == step_id
    assert repeated.json()["state"] == "succeeded"
    assert repeated.json()["resource_id"] == decided.json()["resource_id"]
    # Every key of the task now holds its call's final answer.
    assert (
        rows(
            database,
            "SELECT status_code, response_body->>'state' FROM idempotency_records"
            " WHERE scope = %s AND resource_id = %s",
            f"{agent.principal.tenant}:{agent.principal.name}:task:call",
            task_id,
        )
        == [(200, "succeeded")] * 3
    )
    intent = charged.json()["resource_id"]
    ledger = await stripe_provider.control.ledger()
    assert [e.kind for e in ledger if e.payment_intent == intent] == ["charge", "refund"]


async def test_twenty_calls_then_a_failing_provider_spends_the_one_budget_and_calls_are_refused(
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
    stripe_provider: StripeProvider,
) -> None:
    quick = {
        "max_attempts_per_task": 2,
        "max_attempts_per_step": 2,
        "initial_backoff": "PT0.05S",
        "max_backoff": "PT0.1S",
    }
    created = await http.post(
        f"{gateways[0].url}/v1/tasks",
        json={"open": {}, "budget": quick},
        headers=keyed(agent, unique("open")),
    )
    assert created.status_code == 201, created.text
    task_id = created.json()["task_id"]
    orders_before = count(database, "orders")
    references = [unique("ord") for _ in range(7)]
    loop: list[tuple[str, dict[str, Any]]] = []
    for n in range(20):
        if n % 3 == 0:
            loop.append(("charge_payment", charge(references[n // 3], amount=100 + n)))
        elif n % 3 == 1:
            loop.append(("create_order", order(f"c-loop-{n}")))
        else:
            loop.append(("issue_coupon", {"user_id": unique("u"), "coupon_id": "LOOP"}))
    for index, (tool, arguments) in enumerate(loop):
        response = await call(
            http, gateways[index % 2], agent, task_id, unique("call"), tool, arguments
        )
        assert response.status_code == 200 and response.json()["state"] == "succeeded", (
            response.text
        )
    assert count(database, "orders") == orders_before + 7
    for reference in references:
        assert len(await stripe_provider.charges(reference)) == 1

    # The provider keeps failing (500s before it began: a 429 would only hold the calls,
    # spending nothing): the calls' retries spend the task's one budget...
    await stripe_provider.control.add_fault(
        Fault.ERROR_500_BEFORE_EXECUTING, path_prefix="/v1/payment_intents", times=None
    )
    try:
        failed = []
        for _ in range(2):
            response = await call(
                http,
                gateways[0],
                agent,
                task_id,
                unique("call"),
                "charge_payment",
                charge(unique("ord")),
            )
            # The charge may have happened (a 500): a person decides, the call waits.
            assert response.status_code == 202, response.text
            failed.append(response.json())
        assert [a["state"] for a in failed] == ["parked", "parked"]
        assert "attempts per task used" in (failed[1]["park_reason"] or "")
        # ...after which further calls are refused with the reason, nothing recorded.
        refused = await call(
            http, gateways[1], agent, task_id, unique("call"), "create_order", order("c-late")
        )
        assert refused.status_code == 409, refused.text
        assert "retry budget is spent" in refused.json()["reason"]
    finally:
        await stripe_provider.control.clear_faults()
    listed = await status(http, gateways[0], agent, task_id)
    assert len(listed["steps"]) == 22 and listed["budget"]["attempts_used"] == 2
    assert count(database, "orders") == orders_before + 7


async def test_parallel_calls_meeting_only_500s_send_at_most_n_plus_b_requests(
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    stripe_provider: StripeProvider,
) -> None:
    # A model's five parallel charges while Stripe fails every request (500s before it
    # began, nothing charged; a 429 would only hold the calls, spending nothing): each
    # call's first attempt is free, their retries share the task's 3 (fewer than Stripe's
    # fleet-wide bucket of 5, which binds first otherwise). Judged by the provider's own
    # request log: at most 5 + 3 charge requests reached it (fewer calls, when one
    # arrives after the budget is spent). Stripe's bucket is whole: each test's
    # ``database`` empties the providers' budgets with the business tables.
    parallel, per_task = 5, 3
    budget = {
        "max_attempts_per_task": per_task,
        "max_attempts_per_step": per_task,
        "initial_backoff": "PT0.05S",
        "max_backoff": "PT0.2S",
    }
    created = await http.post(
        f"{gateways[0].url}/v1/tasks",
        json={"open": {}, "budget": budget},
        headers=keyed(agent, unique("open")),
    )
    assert created.status_code == 201, created.text
    task_id = created.json()["task_id"]
    seen_before = len(await stripe_provider.control.requests())
    await stripe_provider.control.add_fault(
        Fault.ERROR_500_BEFORE_EXECUTING, path_prefix="/v1/payment_intents", times=None
    )
    try:
        answers = await asyncio.gather(
            *(
                call(
                    http,
                    gateways[n % 2],
                    agent,
                    task_id,
                    unique("call"),
                    "charge_payment",
                    charge(unique("ord")),
                )
                for n in range(parallel)
            )
        )
    finally:
        await stripe_provider.control.clear_faults()
    # A call admitted after the others' retries spent the budget is refused, unsent.
    admitted = [a for a in answers if a.status_code == 202]
    refused = [a for a in answers if a.status_code != 202]
    assert all(a.status_code == 409 for a in refused), [a.text for a in refused]
    assert all("retry budget is spent" in a.json()["reason"] for a in refused)
    # Their outcome unknown and the budget spent, the calls wait for a person.
    assert admitted and {a.json()["state"] for a in admitted} == {"parked"}
    sent = [
        r
        for r in (await stripe_provider.control.requests())[seen_before:]
        if r.method == "POST" and r.path == "/v1/payment_intents"
    ]
    assert len(admitted) <= len(sent) <= len(admitted) + per_task, len(sent)
    assert {r.outcome for r in sent} == {"faulted"}
    listed = await status(http, gateways[0], agent, task_id)
    assert listed["budget"]["attempts_used"] == len(sent) - len(admitted)


@pytest.fixture(scope="module")
def zero_wait_gateway(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """A gateway that never waits for a running task's answer."""
    gateway = start_gateway(
        stack,
        tmp_path_factory.mktemp("zero-wait") / "gateway.log",
        ONCEFLOW_GATEWAY_REPLAY_WAIT_SECONDS="0",
    )
    yield gateway
    gateway.stop()


async def test_a_gateway_that_never_waits_still_delivers_every_call(
    zero_wait_gateway: GatewayProcess,
    agent: Caller,
    http: httpx.AsyncClient,
    stripe_provider: StripeProvider,
) -> None:
    # The gateway answers at once (202 with the call's state), but only once the task
    # has taken the call: it runs, and the same key answers its end.
    task_id = await open_task(http, zero_wait_gateway, agent)
    order_id, key = unique("ord"), unique("call")
    sent = await call(
        http, zero_wait_gateway, agent, task_id, key, "charge_payment", charge(order_id)
    )
    assert sent.status_code in (200, 202), sent.text
    assert sent.json()["state"] != "pending", sent.text

    async def again() -> httpx.Response:
        return await call(
            http, zero_wait_gateway, agent, task_id, key, "charge_payment", charge(order_id)
        )

    ended = await eventually(
        again,
        until=lambda response: (
            response.status_code == 200 and response.json()["state"] == "succeeded"
        ),
        what="the call's key answers its end",
    )
    [intent] = await stripe_provider.charges(order_id)
    assert ended.json()["resource_id"] == intent.object_id
    closed = await http.post(
        f"{zero_wait_gateway.url}/v1/tasks/{task_id}/close", headers=agent.headers
    )
    assert closed.status_code == 200, closed.text
    assert [step["tool"] for step in closed.json()["steps"]] == ["charge_payment"]
