"""MCP 2026-07-28 (stateless) with the official ``mcp`` client in its default mode over
``onceflow mcp --transport http``, beside a handshake-era session, on the embedded stack
(real Temporal and PostgreSQL, the local Stripe-compatible provider whose ledger judges).

Each era is told only what the server keeps in it; a broken response stream (the era's
cancellation) never cancels a started call, and the call re-issued under a new request
id with its ``idempotency_key`` is answered by the first; a client of the tasks extension
gets a durable task for a call that waits on a person, read from the Temporal task and
by its own principal only.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from onceflow_devstack.stripe_provider import Fault

from onceflow.gateway.mcp_server import (
    DELIBERATE_REPEAT_ARGUMENT,
    REPLAYED_META,
    SESSION_INSTRUCTIONS,
    STATELESS_INSTRUCTIONS,
    TASKS_EXTENSION,
)
from onceflow.task_api import TaskClient
from onceflow.workflows.task_models import ApproveInput
from tests.harness import eventually

from ..conftest import Caller, Stack, StripeProvider, make_caller, rows
from ..test_mcp import start_mcp_http
from .conftest import TOOLS
from .test_mcp import charge, keyed, mcp_session, stop, text_of, unique

MODERN = "2026-07-28"


@dataclass(frozen=True)
class McpProcess:
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def mcp(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpProcess]:
    """One ``onceflow mcp --transport http`` process for the module, and its log."""
    log_path = tmp_path_factory.mktemp("mcp-stateless") / "mcp.log"
    process, url = start_mcp_http(stack, log_path)
    yield McpProcess(url=url, log_path=log_path)
    stop(process)


class TaskParams(types.RequestParams):
    task_id: str


class TaskRequest(types.Request[TaskParams, str]):
    name_param = "taskId"  # the extension's Mcp-Name routing header


class DetailedTask(types.Result):
    """A task as ``tasks/get`` (and, without its outcome, ``tools/call``) shows it."""

    result_type: str | None = None
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class CreateTaskResult(DetailedTask):
    result_type: Literal["task"] = "task"  # type: ignore[assignment]


async def _resolved(task: CreateTaskResult, context: ClaimContext) -> types.CallToolResult:
    """What a tasks client does with a task it did not ask to see: poll it to its end."""
    request = TaskRequest(method="tasks/get", params=TaskParams(task_id=task.task_id))
    ended = await eventually(
        lambda: context.session.send_request(request, DetailedTask),
        until=lambda current: current.status != "working",
        what=f"task {task.task_id} of {context.tool_name} ends",
        interval=0.2,
    )
    assert ended.status == "completed" and ended.result is not None, ended
    return types.CallToolResult.model_validate(ended.result)


class TasksExtension(ClientExtension):
    """What the client declares to take task handles (the SDK ships no tasks client)."""

    identifier = TASKS_EXTENSION

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=_resolved)]


@asynccontextmanager
async def modern_client(url: str, caller: Caller, *, tasks: bool = False) -> AsyncIterator[Client]:
    """The official client in its default mode (it probes ``server/discover`` first)."""
    async with (
        httpx2.AsyncClient(headers=caller.headers, timeout=60) as http,
        Client(
            streamable_http_client(url, http_client=http),
            extensions=[TasksExtension()] if tasks else None,
        ) as client,
    ):
        assert client.protocol_version == MODERN
        yield client


async def tasks_get(client: Client, task_id: str) -> DetailedTask:
    request = TaskRequest(method="tasks/get", params=TaskParams(task_id=task_id))
    return await client.session.send_request(request, DetailedTask)


async def tasks_cancel(client: Client, task_id: str) -> dict[str, Any]:
    request = TaskRequest(method="tasks/cancel", params=TaskParams(task_id=task_id))
    result = await client.session.send_request(request, types.EmptyResult)
    return result.meta or {}


def refund_of(intent: str) -> dict[str, Any]:
    # No amount: a full refund, which always needs a person's approval.
    return {"payment_intent": intent, "reason": "requested_by_customer"}


async def test_each_era_is_told_only_what_the_server_keeps_in_it(
    mcp: McpProcess, agent: Caller, database: str
) -> None:
    async with modern_client(mcp.url, agent) as client:
        modern_instructions = client.instructions
        modern_tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        key = unique("order")
        order = {
            "customer_id": "c-modern",
            "currency": "eur",
            "lines": [{"sku": "mug", "quantity": 1, "unit_price_cents": 900}],
        }
        called = await client.call_tool("create_order", keyed(order, key))
    async with mcp_session(mcp.url, agent) as session:
        assert session.protocol_version == "2025-11-25"
        session_instructions = session.instructions
        session_tools = {tool.name: tool for tool in (await session.list_tools()).tools}

    assert modern_instructions == STATELESS_INSTRUCTIONS
    assert session_instructions == SESSION_INSTRUCTIONS != modern_instructions
    # No promise the stateless era cannot keep: no session; what answers a repeat under
    # a new key is the intent rule every surface shares, and it says so.
    assert "session is one onceflow task" not in modern_instructions
    assert "an earlier call of the session" not in modern_instructions
    assert "its own onceflow task, identified by its idempotency_key" in modern_instructions
    assert "same business intent asked again under a new key" in modern_instructions
    assert "answered by that call (repeat_of)" in session_instructions
    # Both eras may ask for a second identical effect on purpose.
    charge_modern = modern_tools["charge_payment"].input_schema["properties"]
    charge_session = session_tools["charge_payment"].input_schema["properties"]
    assert DELIBERATE_REPEAT_ARGUMENT in charge_modern
    assert DELIBERATE_REPEAT_ARGUMENT in charge_session
    assert "task of its own" in charge_modern["idempotency_key"]["description"]
    assert "task of its own" not in charge_session["idempotency_key"]["description"]
    # And a call is its own task, which its first sentence says.
    body = called.structured_content or {}
    assert body["open"] is False and body["state"] == "succeeded", body
    assert text_of(called).startswith(f"create_order succeeded (task {body['task_id']}")
    assert rows(database, "SELECT count(*) FROM orders") == [(1,)]


async def test_a_broken_stream_never_cancels_a_started_charge_and_the_reissued_call_answers(
    stack: Stack, mcp: McpProcess, agent: Caller, stripe_provider: StripeProvider
) -> None:
    order_id, key = unique("ord"), unique("charge")
    # The provider commits the charge, then holds its answer: the call is mid-effect.
    await stripe_provider.control.add_fault(
        Fault.DELAY_AFTER_COMMIT, path_prefix="/v1/payment_intents", delay_seconds=5.0
    )
    async with modern_client(mcp.url, agent) as client:
        first = asyncio.ensure_future(
            client.call_tool("charge_payment", keyed(charge(order_id), key))
        )
        await eventually(
            lambda: stripe_provider.charges(order_id),
            what="the provider commits the first call's charge",
        )
        # The client gives up on the call: in 2026-07-28 over HTTP that closes the
        # request's response stream, the era's cancellation.
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        await eventually(
            mcp.log,
            until=lambda log: "the client stopped waiting for a call of charge_payment" in log,
            what="the server sees the stream break while the charge is in flight",
        )
        # The client re-issues the call (a new request id) with the same key.
        again = await client.call_tool("charge_payment", keyed(charge(order_id), key))

    ledger = await stripe_provider.charges(order_id)
    assert len(ledger) == 1, ledger
    body = again.structured_content or {}
    assert not again.is_error and body["state"] == "succeeded", body
    [step] = body["steps"]
    assert step["resource_id"] == ledger[0].object_id
    assert f"effect {ledger[0].object_id}" in text_of(again)
    assert again.meta is not None and again.meta[REPLAYED_META] is True
    # One key, one record, one task: the re-issued call ran nothing.
    scope = f"{agent.principal.tenant}:{agent.principal.name}:charge_payment:call"
    assert rows(
        stack.postgres_url,
        "SELECT state, workflow_id FROM idempotency_records WHERE scope = %s",
        scope,
    ) == [("succeeded", body["task_id"])]
    assert await stack.task_workflows(agent.principal.tenant) == 1


async def test_a_call_waiting_for_a_person_is_a_task_polled_until_approved_and_its_principals_only(
    stack: Stack, mcp: McpProcess, agent: Caller, database: str, stripe_provider: StripeProvider
) -> None:
    other = await make_caller(database, tenant=agent.principal.tenant, name="agent-2", tools=TOOLS)
    order_id = unique("ord")
    async with modern_client(mcp.url, agent, tasks=True) as client:
        # (A charge ends within the short wait, so it answers as itself; on a slow
        # machine it may come as a task, which the client's extension polls to its end.)
        charged = await client.call_tool("charge_payment", keyed(charge(order_id), unique("c")))
        [charge_step] = (charged.structured_content or {})["steps"]
        intent = charge_step["resource_id"]

        # A full refund waits for a person: the client gets a task, durably there.
        refund_key = unique("refund")
        created = await client.session.call_tool(
            "refund_payment", keyed(refund_of(intent), refund_key), allow_claimed=True
        )
        assert isinstance(created, CreateTaskResult), created
        assert created.status == "working" and created.result is None
        # Re-issued (its answer lost), the call is the same call, with the same task.
        reissued = await client.session.call_tool(
            "refund_payment", keyed(refund_of(intent), refund_key), allow_claimed=True
        )
        assert isinstance(reissued, CreateTaskResult) and reissued.task_id == created.task_id
        assert created.task_id.startswith("oft_") and len(created.task_id) >= 40
        assert created.ttl_ms is not None and created.ttl_ms > 0 and created.poll_interval_ms
        polled = await tasks_get(client, created.task_id)
        assert polled.status == "working", polled
        assert polled.status_message is not None and "a person decides" in polled.status_message
        assert polled.meta is not None
        workflow_id, step_id = polled.meta["onceflow/task_id"], polled.meta["onceflow/step_id"]

        # Another principal of the same tenant cannot read it: to it, no such task.
        async with modern_client(mcp.url, other, tasks=True) as intruder:
            with pytest.raises(MCPError) as refused:
                await tasks_get(intruder, created.task_id)
            assert refused.value.error.code == types.INVALID_PARAMS
            with pytest.raises(MCPError):
                await tasks_cancel(intruder, created.task_id)
        assert not [
            e
            for e in await stripe_provider.control.ledger()
            if e.kind == "refund" and e.payment_intent == intent
        ]

        # A person approves (as `onceflow approve` does, through the task client).
        tasks = TaskClient(stack.client, task_queue=stack.task_queue)
        waiting = (await tasks.status(workflow_id)).step(step_id)
        await tasks.approve(
            workflow_id,
            ApproveInput(
                step_id=step_id,
                approved=True,
                approver="ops",
                reason="customer asked",
                arguments_digest=waiting.arguments_digest,
            ),
        )
        done = await eventually(
            lambda: tasks_get(client, created.task_id),
            until=lambda task: task.status != "working",
            what="the task completes once the person approved",
        )

    assert done.status == "completed", done
    assert done.result is not None and done.result.get("isError") is False, done.result
    [refund_step] = done.result["structuredContent"]["steps"]
    assert refund_step["state"] == "succeeded"
    refunds = [
        e
        for e in await stripe_provider.control.ledger()
        if e.kind == "refund" and e.payment_intent == intent
    ]
    assert [e.object_id for e in refunds] == [refund_step["resource_id"]]
    # The handle is the principal's, in PostgreSQL; the call's state stayed in Temporal.
    assert rows(
        database,
        "SELECT workflow_id, principal_id FROM mcp_task_handles WHERE task_id = %s",
        created.task_id,
    ) == [(workflow_id, agent.principal.principal_id)]


async def test_cancelling_a_task_withdraws_a_call_not_yet_sent_and_records_it(
    stack: Stack, mcp: McpProcess, agent: Caller, stripe_provider: StripeProvider
) -> None:
    order_id = unique("ord")
    async with modern_client(mcp.url, agent, tasks=True) as client:
        charged = await client.call_tool("charge_payment", keyed(charge(order_id), unique("c")))
        intent = (charged.structured_content or {})["steps"][0]["resource_id"]
        created = await client.session.call_tool(
            "refund_payment", keyed(refund_of(intent), unique("refund")), allow_claimed=True
        )
        assert isinstance(created, CreateTaskResult), created
        cancelled = await tasks_cancel(client, created.task_id)
        assert cancelled["onceflow/cancel"] == "withdrawn", cancelled
        final = await eventually(
            lambda: tasks_get(client, created.task_id),
            until=lambda task: task.status != "working",
            what="the withdrawn call's task ends",
        )
        # Cancelling again changes nothing and says the call had ended.
        again = await tasks_cancel(client, created.task_id)

    assert final.status == "cancelled", final
    assert again["onceflow/cancel"] == "withdrawn"
    assert not [
        e
        for e in await stripe_provider.control.ledger()
        if e.kind == "refund" and e.payment_intent == intent
    ]
    assert final.meta is not None
    status = await TaskClient(stack.client, task_queue=stack.task_queue).status(
        final.meta["onceflow/task_id"]
    )
    [decision] = status.decisions
    assert (decision.decision, decision.operator) == ("deny", agent.principal.name)
    assert "MCP tasks/cancel" in decision.reason


async def test_the_model_repeating_a_charge_under_new_keys_makes_one_payment_intent(
    mcp: McpProcess, agent: Caller, database: str, stripe_provider: StripeProvider
) -> None:
    paid, doubtful = unique("ord"), unique("ord")
    control = stripe_provider.control
    async with modern_client(mcp.url, agent) as client:
        first = await client.call_tool("charge_payment", keyed(charge(paid), unique("c")))
        repeat = await client.call_tool("charge_payment", keyed(charge(paid), unique("c")))

        # A charge whose outcome stays unknown parks; the model repeats it, new key.
        await control.configure(search_lag_seconds=3600)
        await control.add_fault(Fault.ERROR_500_AFTER_COMMIT, path_prefix="/v1/payment_intents")
        await control.add_fault(
            Fault.ERROR_503, method="GET", path_prefix="/v1/payment_intents", times=None
        )
        try:
            parked = await client.call_tool("charge_payment", keyed(charge(doubtful), unique("c")))
        finally:
            await control.clear_faults()
            await control.configure(search_lag_seconds=0)
        parked_body = parked.structured_content or {}
        assert parked_body["state"] == "parked", parked_body
        again = await client.call_tool("charge_payment", keyed(charge(doubtful), unique("c")))

        deliberate = await client.call_tool(
            "charge_payment",
            {**keyed(charge(paid), unique("c")), DELIBERATE_REPEAT_ARGUMENT: True},
        )

    [charged] = (first.structured_content or {})["steps"]
    [answered] = (repeat.structured_content or {})["steps"]
    assert answered["resource_id"] == charged["resource_id"]
    assert answered["result"]["repeat_of"]["task_id"] == (first.structured_content or {})["task_id"]
    # The parked charge: one PaymentIntent, and the repeat names the parked call.
    assert len(await stripe_provider.charges(doubtful)) == 1
    again_body = again.structured_content or {}
    [refused] = again_body["steps"]
    assert again_body["state"] == "failed" and refused["attempts"] == 1
    assert f"held by task {parked_body['task_id']}" in refused["failure_reason"]
    # On purpose: a second charge of the paid order, recorded.
    assert not deliberate.is_error, text_of(deliberate)
    assert len(await stripe_provider.charges(paid)) == 2
    assert rows(
        database,
        "SELECT count(*) FROM intent_deliberate_repeats WHERE tenant = %s",
        agent.principal.tenant,
    ) == [(1,)]
