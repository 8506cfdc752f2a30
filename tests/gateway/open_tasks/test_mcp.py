"""One MCP session is one open task: ``onceflow mcp --transport http`` with the MCP SDK's
own client, on the embedded stack (real Temporal and PostgreSQL, a worker running the
built-in tools, the local Stripe-compatible provider).

The session's first tool call opens the task, each call of the session is a call of it,
and the session's end closes it. Each test judges by the far sides' records: the
provider's ledger, the orders and coupon tables, the idempotency records and the task
workflows in Temporal (read back through the gateway's ``GET /v1/tasks/{id}``).
"""

import asyncio
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client
from onceflow_devstack.stripe_provider import Fault, RequestRecord

from onceflow.gateway.mcp_server import (
    DELIBERATE_REPEAT_ARGUMENT,
    REPLAYED_META,
    TASK_STATUS_TOOL,
    build_mcp_server,
    fixed_principal,
)
from onceflow.payments import STRIPE
from tests.harness import HANG_SECONDS, eventually

from ..conftest import (
    Caller,
    GatewayProcess,
    Stack,
    StripeProvider,
    count,
    make_caller,
    open_service,
    rows,
)
from ..test_mcp import start_mcp_http

COUPON = {"user_id": "u-mcp", "coupon_id": "WELCOME10"}
ORDER = {
    "customer_id": "c-mcp",
    "currency": "eur",
    "lines": [{"sku": "mug", "quantity": 2, "unit_price_cents": 1250}],
}


@pytest.fixture(scope="module")
def mcp_url(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One ``onceflow mcp --transport http`` process for the module."""
    process, url = start_mcp_http(stack, tmp_path_factory.mktemp("mcp") / "mcp.log")
    yield url
    stop(process)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=HANG_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


@asynccontextmanager
async def mcp_session(
    url: str, caller: Caller, *, terminate_on_close: bool = True
) -> AsyncIterator[ClientSession]:
    """An MCP session over streamable HTTP; leaving the block ends it (DELETE)."""
    async with (
        httpx2.AsyncClient(headers=caller.headers, timeout=60) as http,
        streamable_http_client(url, http_client=http, terminate_on_close=terminate_on_close) as (
            read,
            write,
        ),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def keyed(arguments: dict[str, Any], key: str, **more: Any) -> dict[str, Any]:
    return {**arguments, "idempotency_key": key, **more}


def charge(order_id: str) -> dict[str, Any]:
    return {
        "amount": 2500,
        "currency": "eur",
        "customer": "cus_alice",
        "payment_method": "pm_card_visa",
        "order_id": order_id,
    }


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(part.text for part in result.content if isinstance(part, types.TextContent))


def succeeded(result: types.CallToolResult) -> dict[str, Any]:
    """The call's view, after checking the call succeeded."""
    body = result.structured_content or {}
    assert not result.is_error, body
    assert body["state"] == "succeeded" and body["ended"] is True, body
    return body


async def task(
    http: httpx.AsyncClient, gateway: GatewayProcess, caller: Caller, task_id: str
) -> dict[str, Any]:
    """``GET /v1/tasks/{id}`` through the HTTP gateway."""
    response = await http.get(f"{gateway.url}/v1/tasks/{task_id}", headers=caller.headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def call_records(database: str, caller: Caller) -> int:
    return int(
        rows(
            database,
            "SELECT count(*) FROM idempotency_records WHERE scope = %s",
            f"{caller.principal.tenant}:{caller.principal.name}:task:call",
        )[0][0]
    )


async def test_an_mcp_session_is_one_open_task_and_its_end_closes_the_task(
    stack: Stack,
    mcp_url: str,
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
    stripe_provider: StripeProvider,
) -> None:
    order_id = unique("ord")
    charge_key = unique("charge")
    async with mcp_session(mcp_url, agent) as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert DELIBERATE_REPEAT_ARGUMENT in listed["charge_payment"].input_schema["properties"]
        # A session that only lists tools opens nothing.
        assert count(database, "idempotency_records") == 0

        coupon = succeeded(await session.call_tool("issue_coupon", keyed(COUPON, unique("k"))))
        order = succeeded(await session.call_tool("create_order", keyed(ORDER, unique("k"))))
        charged_result = await session.call_tool(
            "charge_payment", keyed(charge(order_id), charge_key)
        )
        charged = succeeded(charged_result)
        calls = [coupon, order, charged]
        task_id = coupon["task_id"]
        assert all(call["task_id"] == task_id and call["repeat_of"] is None for call in calls)
        assert len({call["step_id"] for call in calls}) == 3
        assert f"charge_payment succeeded (call {charged['step_id']} of task {task_id})" in (
            text_of(charged_result)
        )

        # Three calls, one task: the task lists them in order, one workflow ran them.
        during = await task(http, gateways[0], agent, task_id)
        assert during["open"] is True and during["state"] == "running"
        assert during["closing"] is None
        assert [step["step_id"] for step in during["steps"]] == [c["step_id"] for c in calls]
        assert [step["tool"] for step in during["steps"]] == [
            "issue_coupon",
            "create_order",
            "charge_payment",
        ]
        assert await stack.task_workflows(agent.principal.tenant) == 1

        # The client retries the charge with its key (its answer was lost): the same call.
        retried = await session.call_tool("charge_payment", keyed(charge(order_id), charge_key))
        assert retried.structured_content == charged
        assert retried.meta is not None and retried.meta[REPLAYED_META] is True

        # The model picks the same charge again: a new call, so a new key. The task's
        # repeat guard answers it with the first charge; nothing is charged again.
        repeated_result = await session.call_tool(
            "charge_payment", keyed(charge(order_id), unique("k"))
        )
        repeated = succeeded(repeated_result)
        assert repeated["repeat_of"] == charged["step_id"]
        assert repeated["step_id"] != charged["step_id"] and repeated["attempts"] == 0
        assert repeated["resource_id"] == charged["resource_id"]
        assert repeated_result.meta is not None and repeated_result.meta[REPLAYED_META] is False
        assert f"as call {charged['step_id']} of this task" in text_of(repeated_result)
        assert "nothing ran again" in text_of(repeated_result)

    # Leaving the block deleted the session: its task closes.
    final = await eventually(
        lambda: task(http, gateways[1], agent, task_id),
        until=lambda current: current["state"] == "closed",
        what="the session's task closes once the session ended",
    )
    assert final["closing"] == "closed by the agent"
    assert [(s["tool"], s["repeat_of"]) for s in final["steps"]] == [
        ("issue_coupon", None),
        ("create_order", None),
        ("charge_payment", None),
        ("charge_payment", charged["step_id"]),
    ]
    # The far sides: one effect per call the model meant.
    assert count(database, "coupon_issuances") == 1
    assert count(database, "orders") == 1
    ledger = await stripe_provider.charges(order_id)
    assert [entry.object_id for entry in ledger] == [charged["resource_id"]]
    assert await stack.task_workflows(agent.principal.tenant) == 1
    # Four keys, four calls (the retry was its key's replay); one task, whose final view
    # the workflow stored for the key the session opened it with.
    assert call_records(database, agent) == 4
    await eventually(
        lambda: rows(
            database,
            "SELECT state, response_body->>'state' FROM idempotency_records WHERE workflow_id = %s",
            task_id,
        ),
        until=lambda found: found == [("succeeded", "closed")],
        what="the closed task's outcome reaches the record of the session's task",
    )


async def test_a_call_awaiting_approval_says_a_person_decides_and_its_key_answers_the_decision(
    mcp_url: str,
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
    stripe_provider: StripeProvider,
) -> None:
    operator = await make_caller(
        database, tenant=agent.principal.tenant, name="ops", tools=(), may_decide=True
    )
    order_id = unique("ord")
    refund_key = unique("refund")
    async with mcp_session(mcp_url, agent) as session:
        charged = succeeded(
            await session.call_tool("charge_payment", keyed(charge(order_id), unique("k")))
        )
        refund = {"charge_step": charged["step_id"], "reason": "requested_by_customer"}
        # A full refund needs a person's approval: the call answers at once, and says so.
        waiting_result = await session.call_tool("refund_payment", keyed(refund, refund_key))
        waiting = waiting_result.structured_content or {}
        assert not waiting_result.is_error, waiting
        assert waiting["state"] == "awaiting_approval" and waiting["ended"] is False
        message = text_of(waiting_result)
        assert "a person is deciding" in message
        assert "Do not call it again, with this or a new idempotency_key" in message
        assert TASK_STATUS_TOOL in message

        # The model asks for the same refund again: the guard answers with the waiting one.
        twin = await session.call_tool("refund_payment", keyed(refund, unique("k")))
        assert twin.structured_content is not None
        assert twin.structured_content["repeat_of"] == waiting["step_id"]
        assert twin.structured_content["state"] == "awaiting_approval"

        approved = await http.post(
            f"{gateways[0].url}/v1/tasks/{waiting['task_id']}/approve",
            json={
                "step_id": waiting["step_id"],
                "approved": True,
                "reason": "customer asked",
                "arguments_digest": waiting["arguments_digest"],
            },
            headers=operator.headers,
        )
        assert approved.status_code == 200, approved.text
        # The same key asks the task again: once the refund ran, its final answer.
        decided = await eventually(
            lambda: session.call_tool("refund_payment", keyed(refund, refund_key)),
            until=lambda result: (result.structured_content or {}).get("ended") is True,
            what="the waiting call's key answers with the refund once it ran",
        )
        assert succeeded(decided)["step_id"] == waiting["step_id"]
        assert decided.meta is not None and decided.meta[REPLAYED_META] is True

    ledger = await stripe_provider.control.ledger()
    intent = charged["resource_id"]
    assert [entry.kind for entry in ledger if entry.payment_intent == intent] == [
        "charge",
        "refund",
    ]


async def test_a_deliberate_repeat_in_a_session_makes_a_second_effect(
    mcp_url: str, agent: Caller, database: str
) -> None:
    async with mcp_session(mcp_url, agent) as session:
        first = succeeded(await session.call_tool("create_order", keyed(ORDER, unique("k"))))
        # The customer really wants a second, identical order: the model says so.
        second = succeeded(
            await session.call_tool(
                "create_order", keyed(ORDER, unique("k"), **{DELIBERATE_REPEAT_ARGUMENT: True})
            )
        )

    assert second["task_id"] == first["task_id"]
    assert second["repeat_of"] is None and second["deliberate_repeat"] is True
    assert second["resource_id"] != first["resource_id"]
    assert count(database, "orders") == 2


async def test_a_session_goes_on_in_a_new_task_when_its_task_takes_no_more_calls(
    mcp_url: str,
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
) -> None:
    key = unique("order")
    async with mcp_session(mcp_url, agent) as session:
        coupon = succeeded(await session.call_tool("issue_coupon", keyed(COUPON, unique("k"))))
        first_task = coupon["task_id"]
        # Someone closes the session's task (as its idle timeout, lifetime or deadline
        # would end it): it takes no more calls.
        closed = await http.post(
            f"{gateways[0].url}/v1/tasks/{first_task}/close", headers=agent.headers
        )
        assert closed.status_code == 200, closed.text

        # The session's next call goes to the session's next task instead of failing.
        order = succeeded(await session.call_tool("create_order", keyed(ORDER, key)))
        second_task = order["task_id"]
        assert second_task != first_task
        # Its retry with the same key is the same call there.
        retried = await session.call_tool("create_order", keyed(ORDER, key))
        assert retried.structured_content == order
        assert retried.meta is not None and retried.meta[REPLAYED_META] is True

    for task_id, tool in ((first_task, "issue_coupon"), (second_task, "create_order")):
        ended = await eventually(
            lambda task_id=task_id: task(http, gateways[1], agent, task_id),  # type: ignore[misc]
            until=lambda current: current["state"] == "closed",
            what=f"task {task_id} ends closed",
        )
        assert [step["tool"] for step in ended["steps"]] == [tool]
    assert count(database, "orders") == 1
    assert count(database, "coupon_issuances") == 1


async def test_a_long_session_goes_on_past_its_tasks_deadline(
    stack: Stack, agent: Caller, database: str
) -> None:
    # A stdio session may last for days; an open task takes no call after its budget's
    # deadline (1 hour by default; 3 seconds here).
    session_task = {"open": {}, "budget": {"deadline": "PT3S", "max_backoff": "PT1S"}}
    async with open_service(stack) as service:
        server = build_mcp_server(
            service, fixed_principal(agent.principal), session_task=session_task
        )
        async with Client(server) as client:
            coupon = succeeded(await client.call_tool("issue_coupon", keyed(COUPON, unique("k"))))
            first_task = coupon["task_id"]
            status = await service.task_status(agent.principal, first_task)
            await eventually(
                lambda: datetime.now(UTC),
                until=lambda now: now > status.budget.deadline_at,
                what="the session's first task's deadline passes",
            )
            key = unique("order")
            order = succeeded(await client.call_tool("create_order", keyed(ORDER, key)))
            again = await client.call_tool("create_order", keyed(ORDER, key))
        # The client left: the run (its one session) ended, and closed both tasks.
        first = await service.task_status(agent.principal, first_task)
        second = await service.task_status(agent.principal, order["task_id"])

    assert order["task_id"] != first_task
    assert again.structured_content == order
    assert [step.tool for step in first.steps] == ["issue_coupon"]
    assert [step.tool for step in second.steps] == ["create_order"]
    assert first.closing == second.closing == "closed by the agent"
    assert count(database, "orders") == 1


async def test_a_retry_from_a_new_session_is_the_same_call(
    stack: Stack,
    mcp_url: str,
    agent: Caller,
    database: str,
) -> None:
    key = unique("order")
    async with mcp_session(mcp_url, agent) as session:
        first = succeeded(await session.call_tool("create_order", keyed(ORDER, key)))
    # The client's connection broke before the answer arrived; it starts a new session
    # and sends the call again with its key.
    async with mcp_session(mcp_url, agent) as session:
        again = await session.call_tool("create_order", keyed(ORDER, key))
        other = succeeded(await session.call_tool("issue_coupon", keyed(COUPON, unique("k"))))

    assert again.structured_content == first
    assert again.meta is not None and again.meta[REPLAYED_META] is True
    assert count(database, "orders") == 1
    # The second session opened its own task only for its new call.
    assert other["task_id"] != first["task_id"]
    assert await stack.task_workflows(agent.principal.tenant) == 2


async def test_a_request_outside_any_session_runs_as_a_one_step_task(
    stack: Stack, mcp_url: str, agent: Caller, database: str
) -> None:
    key = unique("order")
    # The 2026-07-28 protocol over HTTP has no session: each request stands alone.
    async with (
        httpx2.AsyncClient(headers=agent.headers, timeout=60) as http,
        Client(streamable_http_client(mcp_url, http_client=http)) as client,
    ):
        assert client.protocol_version not in (None, "2025-11-25", "2025-06-18")
        first = await client.call_tool("create_order", keyed(ORDER, key))
        again = await client.call_tool("create_order", keyed(ORDER, key))

    body = first.structured_content or {}
    assert not first.is_error, body
    assert body["state"] == "succeeded" and [s["tool"] for s in body["steps"]] == ["create_order"]
    assert again.structured_content == body
    assert again.meta is not None and again.meta[REPLAYED_META] is True
    assert count(database, "orders") == 1
    assert rows(database, "SELECT scope FROM idempotency_records") == [
        (f"{agent.principal.tenant}:{agent.principal.name}:create_order:call",)
    ]
    assert await stack.task_workflows(agent.principal.tenant) == 1


async def test_the_server_shutting_down_closes_its_open_sessions_tasks(
    stack: Stack,
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    tmp_path: Path,
) -> None:
    process, url = start_mcp_http(stack, tmp_path / "mcp.log")
    try:
        async with mcp_session(url, agent, terminate_on_close=False) as session:
            coupon = succeeded(await session.call_tool("issue_coupon", keyed(COUPON, unique("k"))))
            # The server stops while the session is open (SIGTERM, as on a deploy). Waited
            # for in a thread: this loop runs the worker that answers the server's close.
            await asyncio.to_thread(stop, process)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    log = (tmp_path / "mcp.log").read_text()
    assert "did not close" not in log, log
    final = await eventually(
        lambda: task(http, gateways[0], agent, coupon["task_id"]),
        until=lambda current: current["state"] == "closed",
        what="the open session's task closes when the server shuts down",
    )
    assert final["closing"] == "closed by the agent"
    assert f"ended: task {coupon['task_id']}" in log


async def test_the_repeat_guard_spans_the_session_across_its_task_rollover(
    mcp_url: str,
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    stripe_provider: StripeProvider,
) -> None:
    order_id = unique("ord")
    async with mcp_session(mcp_url, agent) as session:
        charged = succeeded(
            await session.call_tool("charge_payment", keyed(charge(order_id), unique("k")))
        )
        first_task = charged["task_id"]
        # The session's task ends (its idle timeout, lifetime or someone closing it).
        closed = await http.post(
            f"{gateways[0].url}/v1/tasks/{first_task}/close", headers=agent.headers
        )
        assert closed.status_code == 200, closed.text
        # The model charges the same order again, under a new key: the session's next task
        # would take it, but the session's guard answers it with the first charge.
        again = succeeded(
            await session.call_tool("charge_payment", keyed(charge(order_id), unique("k")))
        )
        assert again["repeat_of"] == charged["step_id"] and again["task_id"] == first_task
        assert again["resource_id"] == charged["resource_id"]
        # Other calls still roll over to the session's next task.
        coupon = succeeded(await session.call_tool("issue_coupon", keyed(COUPON, unique("k"))))
        assert coupon["task_id"] != first_task

    assert len(await stripe_provider.charges(order_id)) == 1


async def test_parallel_calls_in_a_session_meeting_a_failing_provider_wait_then_charge_once(
    mcp_url: str,
    agent: Caller,
    stripe_provider: StripeProvider,
    gateways: tuple[GatewayProcess, GatewayProcess],
    http: httpx.AsyncClient,
) -> None:
    # A model's five parallel charges in one session while Stripe refuses every request
    # (503): each call's first attempt goes out, then Stripe's fleet-wide bucket of
    # retries (its budget is whole: ``database`` empties it); the calls then wait for
    # Stripe, off their task's clock, with one retry per interval probing it. Once it
    # answers again every call charges, once. Judged by the provider's own records.
    parallel, bucket = 5, int(STRIPE.retry_tokens)
    seen_before = len(await stripe_provider.control.requests())

    def charges_sent(log: list[RequestRecord]) -> list[RequestRecord]:
        return [
            r for r in log[seen_before:] if r.method == "POST" and r.path == "/v1/payment_intents"
        ]

    async def answer_again_once_the_bucket_is_spent() -> float:
        await eventually(
            stripe_provider.control.requests,
            until=lambda log: len(charges_sent(log)) >= parallel + bucket,
            what="the first attempts and Stripe's bucket of retries reach it",
        )
        spent_at = time.monotonic()
        await stripe_provider.control.clear_faults()
        return spent_at

    await stripe_provider.control.add_fault(
        Fault.ERROR_503, path_prefix="/v1/payment_intents", times=None
    )
    started = time.monotonic()
    try:
        async with mcp_session(mcp_url, agent) as session:
            orders = [unique("ord") for _ in range(parallel)]
            results, spent_at = await asyncio.gather(
                asyncio.gather(
                    *(
                        session.call_tool("charge_payment", keyed(charge(order), unique("k")))
                        for order in orders
                    )
                ),
                answer_again_once_the_bucket_is_spent(),
            )
    finally:
        await stripe_provider.control.clear_faults()
    # A call still waiting when its answer was due is answered with its state (running,
    # backing off); the task's status says when every one has charged.
    views = [result.structured_content or {} for result in results]
    [task_id] = {view["task_id"] for view in views}
    url = f"{gateways[0].url}/v1/tasks/{task_id}"

    async def task_status() -> dict[str, Any]:
        answer: dict[str, Any] = (await http.get(url, headers=agent.headers)).json()
        return answer

    final = await eventually(
        task_status,
        until=lambda task: [step["state"] for step in task["steps"]] == ["succeeded"] * parallel,
        what="every call charges once Stripe answers again",
    )
    assert all(step["waiting_for_provider"] is None for step in final["steps"])
    refused = [r for r in charges_sent(await stripe_provider.control.requests()) if r.status == 503]
    # The first attempts, the bucket, and at most one probe per interval while it failed.
    probes = (spent_at - started) / STRIPE.probe_every.total_seconds() + 1
    assert parallel <= len(refused) <= parallel + bucket + probes, len(refused)
    for order in orders:
        assert len(await stripe_provider.charges(order)) == 1
