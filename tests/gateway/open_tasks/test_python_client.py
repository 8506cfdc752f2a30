"""``onceflow_client``'s open tasks against live gateway processes, a worker running the
built-in tools and the local Stripe-compatible provider, judged by the provider's ledger
and the orders and coupon tables.

Every test runs twice: through gateways with the default bounded wait, and through
gateways that never wait for an answer (``ONCEFLOW_GATEWAY_REPLAY_WAIT_SECONDS=0``: each
call is answered at once, with its state, once the task has taken it).
"""

import asyncio
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from onceflow_client import CallRefused, CallResult, OnceflowClient

from tests.harness import HANG_SECONDS, eventually

from ..conftest import (
    Caller,
    GatewayProcess,
    Stack,
    StripeProvider,
    count,
    make_caller,
    rows,
    start_gateway,
)


@pytest.fixture(scope="module", params=["bounded-wait", "zero-wait"])
def gateways(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    """Two gateway processes on the module's stack, as behind a load balancer."""
    settings = {"ONCEFLOW_GATEWAY_REPLAY_WAIT_SECONDS": "0"} if request.param == "zero-wait" else {}
    logs = tmp_path_factory.mktemp(f"gateways-{request.param}")
    first = start_gateway(stack, logs / "a.log", **settings)
    try:
        second = start_gateway(stack, logs / "b.log", **settings)
    except BaseException:
        first.stop()
        raise
    yield first, second
    first.stop()
    second.stop()


ORDER = {
    "customer_id": "c-client",
    "currency": "usd",
    "lines": [{"sku": "tee", "quantity": 1, "unit_price_cents": 2000}],
}


def charge(order_id: str, amount: int = 1500) -> dict[str, Any]:
    return {
        "amount": amount,
        "currency": "usd",
        "customer": "cus_bob",
        "payment_method": "pm_card_visa",
        "order_id": order_id,
    }


class LoseFirstCallAnswer(httpx.AsyncBaseTransport):
    """Delivers every request but drops the answer to the first call, like a timed-out
    network: the gateway did the work, the agent never heard of it."""

    def __init__(self) -> None:
        self._real = httpx.AsyncHTTPTransport()
        self.calls = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        is_call = request.method == "POST" and request.url.path.endswith("/calls")
        self.calls += is_call
        response = await self._real.handle_async_request(request)
        if is_call and self.calls == 1:
            await response.aread()
            raise httpx.ReadTimeout("answer lost", request=request)
        return response

    async def aclose(self) -> None:
        await self._real.aclose()


async def test_an_agent_loop_in_an_open_task_context(
    stack: Stack,
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    database: str,
    stripe_provider: StripeProvider,
) -> None:
    first_order, second_order = f"ord-{uuid.uuid4().hex[:8]}", f"ord-{uuid.uuid4().hex[:8]}"
    async with OnceflowClient(gateways[0].url, api_key=agent.api_key) as onceflow:
        async with onceflow.open_task(
            idle_timeout=timedelta(minutes=10), budget={"max_attempts_per_task": 8}
        ) as task:
            coupon = await task.call("issue_coupon", {"user_id": "u-7", "coupon_id": "HELLO"})
            made = await task.call("create_order", ORDER)
            charged = await task.call("charge_payment", charge(first_order))
            # The model picks the same charge again: answered, not run.
            repeated = await task.call("charge_payment", charge(first_order))
            other = await task.call("charge_payment", charge(second_order, amount=700))
            # A second identical effect on purpose.
            deliberate = await task.call(
                "charge_payment", charge(second_order, amount=700), deliberate_repeat=True
            )
            calls = await task.status()
        task_id = task.task_id
        final = await eventually(
            lambda: onceflow.status(task_id),
            until=lambda status: status["state"] == "closed",
            what="the task closed when its block ended",
        )

    answers = [coupon, made, charged, repeated, other, deliberate]
    assert all(isinstance(answer, CallResult) for answer in answers)
    assert all(answer.succeeded and answer.ended for answer in answers)
    assert all(answer.task_id == task_id for answer in answers)
    assert repeated.repeat_of == charged.step_id and repeated.resource_id == charged.resource_id
    assert deliberate.deliberate_repeat and deliberate.repeat_of is None
    assert deliberate.resource_id != other.resource_id
    assert made.result["total_cents"] == 2000
    assert [step["step_id"] for step in calls["steps"]] == [a.step_id for a in answers]
    assert final["closing"] == "closed by the agent" and len(final["steps"]) == 6
    assert calls["budget"]["budget"]["max_attempts_per_task"] == 8

    assert [e.object_id for e in await stripe_provider.charges(first_order)] == [
        charged.resource_id
    ]
    assert sorted(e.object_id for e in await stripe_provider.charges(second_order)) == sorted(
        [other.resource_id, deliberate.resource_id]
    )
    assert count(database, "orders") == 1
    assert count(database, "coupon_issuances") == 1
    assert await stack.task_workflows(agent.principal.tenant) == 1


async def test_a_lost_answer_is_asked_again_with_the_same_key_and_charges_once(
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    database: str,
    stripe_provider: StripeProvider,
) -> None:
    order_id = f"ord-{uuid.uuid4().hex[:8]}"
    transport = LoseFirstCallAnswer()
    async with OnceflowClient(
        gateways[1].url, api_key=agent.api_key, transport=transport
    ) as onceflow:
        async with onceflow.open_task() as task:
            answer = await task.call("charge_payment", charge(order_id))
            status = await task.status()

    assert transport.calls == 2, "the call was sent twice"
    assert answer.succeeded and answer.replayed, "the resend was answered as the same call"
    assert [step["step_id"] for step in status["steps"]] == [answer.step_id]
    assert len(await stripe_provider.charges(order_id)) == 1
    scope = f"{agent.principal.tenant}:{agent.principal.name}:task:call"
    assert rows(database, "SELECT count(*) FROM idempotency_records WHERE scope = %s", scope) == [
        (1,)
    ]


async def test_refused_calls_raise_with_the_reason_and_waiting_returns_the_decision(
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    database: str,
    stripe_provider: StripeProvider,
) -> None:
    operator = await make_caller(
        database, tenant=agent.principal.tenant, name="ops", tools=(), may_decide=True
    )
    order_id = f"ord-{uuid.uuid4().hex[:8]}"
    async with (
        OnceflowClient(gateways[0].url, api_key=agent.api_key) as onceflow,
        httpx.AsyncClient(base_url=gateways[1].url, headers=operator.headers) as ops,
    ):
        task = await onceflow.create_open_task(idle_timeout="PT5M")
        charged = await task.call("charge_payment", charge(order_id), call_id="pay-1")
        # A full refund needs a person: the call answers at once, not ended.
        asked = await task.call("refund_payment", {"charge_step": "pay-1"})
        assert asked.state == "awaiting_approval" and asked.waiting_for_person
        assert not asked.ended and asked.status_code == 202

        waiting = asyncio.create_task(task.wait(asked, timeout=HANG_SECONDS))
        approved = await ops.post(
            f"/v1/tasks/{task.task_id}/approve",
            json={
                "step_id": asked.step_id,
                "approved": True,
                "reason": "customer asked",
                "arguments_digest": asked.body["arguments_digest"],
            },
        )
        assert approved.status_code == 200, approved.text
        refunded = await waiting
        assert refunded.succeeded and refunded.step_id == asked.step_id

        # The call id reused for another call: refused, with the task's reason.
        with pytest.raises(CallRefused) as reused:
            await task.call("create_order", ORDER, call_id="pay-1")
        assert "was used for another call" in reused.value.reason
        assert reused.value.status == 409

        closed = await task.close()
        assert closed["closing"] == "closed by the agent"
        with pytest.raises(CallRefused) as refused:
            await task.call("create_order", ORDER)
        assert "no more calls" in refused.value.reason or "ended" in refused.value.reason
        again = await task.close()
        assert again["closing"] == "closed by the agent"

    intent = charged.resource_id
    ledger = await stripe_provider.control.ledger()
    assert [entry.kind for entry in ledger if entry.payment_intent == intent] == [
        "charge",
        "refund",
    ]
    assert count(database, "orders") == 0
