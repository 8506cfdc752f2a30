"""A storm of repeats answered from memory (``onceflow/gateway/_answer_cache.py``), on the
real stack: PostgreSQL, Temporal and a worker.

The HTTP API runs in process around a boundary service whose database pool counts every
connection it hands out: every statement the gateway runs (authentication, claims,
reads) takes one, so an unchanged count across a storm proves that no request of it
made a database round trip. The principal cache listens as in a gateway process, and
forgets (with the remembered answers) what it hears of.
"""

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import psycopg
from mcp import Client
from starlette.middleware import Middleware

from onceflow.gateway import (
    BoundaryService,
    GatewaySettings,
    PrincipalStore,
    ensure_prune_schedule,
    prune_schedule_id,
)
from onceflow.gateway._principal_cache import PrincipalCache, principal_cache
from onceflow.gateway.http_api import build_app
from onceflow.gateway.mcp_server import REPLAYED_META, build_mcp_server, fixed_principal
from onceflow.idempotency import PRUNED_RECORDS_CHANNEL, IdempotencyStore
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient
from tests.harness import HANG_SECONDS, eventually

from .conftest import Caller, HoldAfterClaim, Stack, count, execute, open_service, rows

COUPON = {"user_id": "u-storm", "coupon_id": "STORM10"}
STORM = 40


class Checkouts:
    """Counts the connections a pool hands out: one per statement the gateway runs."""

    def __init__(self, pool: Any) -> None:
        self.count = 0
        checkout: Callable[..., Any] = pool.connection

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return checkout(*args, **kwargs)

        pool.connection = counted


@dataclass(frozen=True)
class Gateway:
    """One gateway in process: its HTTP API, its pool's checkouts, its principal cache."""

    http: httpx.AsyncClient
    checkouts: Checkouts
    principals: PrincipalCache
    service: BoundaryService
    routed: "Routed"

    async def call(self, caller: Caller, key: str, body: dict[str, Any]) -> httpx.Response:
        return await self.http.post(
            "/v1/tools/issue_coupon/calls",
            json=body,
            headers={**caller.headers, "Idempotency-Key": key},
        )

    async def send(self, caller: Caller, key: str, body: bytes) -> httpx.Response:
        """A call whose body is sent exactly as ``body``."""
        return await self.http.post(
            "/v1/tools/issue_coupon/calls",
            content=body,
            headers={
                **caller.headers,
                "Idempotency-Key": key,
                "Content-Type": "application/json",
            },
        )


class FullChecks:
    """Counts the tool calls the service checks in full (parsed, validated,
    fingerprinted): every one that was not answered as a repeat of vouched-for bytes."""

    def __init__(self, service: BoundaryService) -> None:
        self.count = 0
        call_tool: Callable[..., Any] = service.call_tool

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return await call_tool(*args, **kwargs)

        service.call_tool = counted  # type: ignore[method-assign]


@asynccontextmanager
async def gateway(stack: Stack, **settings: Any) -> AsyncIterator[Gateway]:
    """A gateway's HTTP API over the stack, its pool counted (``GatewaySettings``)."""
    async with (
        build_pool(stack.postgres_url, max_size=4, autocommit=True) as pool,
        principal_cache(stack.postgres_url) as principals,
    ):
        await eventually(lambda: principals.listening, what="the gateway listens for changes")
        checkouts = Checkouts(pool)
        service = BoundaryService(
            principals=PrincipalStore(pool, cache=principals),
            records=IdempotencyStore(pool),
            tasks=TaskClient(stack.client, task_queue=stack.task_queue),
            settings=GatewaySettings(**settings),
        )
        app = build_app(lambda: contextlib.nullcontext(service))
        # The lifespan would open the service; this one is open already.
        app.state.service = service
        routed = Routed(app)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield Gateway(
                http=http,
                checkouts=checkouts,
                principals=principals,
                service=service,
                routed=routed,
            )


def answer_of(response: httpx.Response) -> tuple[int, tuple[tuple[str, str], ...], bytes]:
    """All a client can tell of an answer: status, headers and the body's bytes."""
    return response.status_code, tuple(sorted(response.headers.items())), response.content


async def remembered(gateway: Gateway, caller: Caller, key: str) -> httpx.Response:
    """Answer a request under ``key``, then a repeat from the table (which remembers it);
    returns that repeat's answer."""
    first = await gateway.call(caller, key, COUPON)
    assert first.status_code == 200, first.text
    assert "Idempotent-Replayed" not in first.headers
    repeat = await gateway.call(caller, key, COUPON)
    assert repeat.status_code == 200 and repeat.headers["Idempotent-Replayed"] == "true"
    return repeat


async def test_a_storm_of_repeats_is_answered_from_memory_exactly_as_from_the_table(
    stack: Stack, agent: Caller, database: str
) -> None:
    async with gateway(stack) as remembering:
        from_table = await remembered(remembering, agent, "storm-0001")
        before = remembering.checkouts.count

        storm = await asyncio.gather(
            *(remembering.call(agent, "storm-0001", COUPON) for _ in range(STORM))
        )

        assert remembering.checkouts.count == before, "no request of the storm read the database"
    assert {answer_of(answer) for answer in storm} == {answer_of(from_table)}
    assert count(database, "coupon_issuances") == 1
    assert rows(database, "SELECT state FROM idempotency_records") == [("succeeded",)]


async def test_a_repeat_of_the_same_bytes_is_answered_without_being_checked_again(
    stack: Stack, agent: Caller, database: str
) -> None:
    async with gateway(stack) as remembering:
        checked = FullChecks(remembering.service)
        await remembered(remembering, agent, "storm-0100")
        assert checked.count == 2, "the first request and the first repeat are checked in full"

        storm = await asyncio.gather(
            *(remembering.call(agent, "storm-0100", COUPON) for _ in range(STORM))
        )
        assert checked.count == 2, "the same bytes again are answered from memory alone"

        # Another spelling of the same JSON is checked in full once, then vouched for too.
        respelled = json.dumps(COUPON, indent=2).encode()
        spelled = [await remembering.send(agent, "storm-0100", respelled) for _ in range(3)]
        assert checked.count == 3

        # Another body under the key is never answered from memory: refused as before.
        other = await remembering.call(agent, "storm-0100", {**COUPON, "coupon_id": "OTHER"})
        assert checked.count == 4

    assert {answer_of(answer) for answer in storm} == {answer_of(spelled[0])}
    assert {answer_of(answer) for answer in spelled} == {answer_of(spelled[0])}
    assert other.status_code == 422 and other.json()["type"].endswith("idempotency-key-reused")
    assert count(database, "coupon_issuances") == 1


class Routed:
    """Counts the requests that reach the app's routing: the innermost middleware, inside
    the one that answers vouched repeats before routing (``_http_repeats``)."""

    def __init__(self, app: Any) -> None:
        self.count = 0
        counter = self

        class Counting:
            def __init__(self, app: Any) -> None:
                self.app = app

            async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
                counter.count += scope["type"] == "http"
                await self.app(scope, receive, send)

        app.user_middleware.append(Middleware(Counting))


async def test_a_repeat_of_vouched_bytes_is_answered_before_routing(
    stack: Stack, agent: Caller, database: str
) -> None:
    async with gateway(stack) as remembering:
        from_route = await remembered(remembering, agent, "storm-0200")
        routed_before = remembering.routed.count
        assert routed_before == 2, "the first request and the first repeat took the route"

        storm = await asyncio.gather(
            *(remembering.call(agent, "storm-0200", COUPON) for _ in range(STORM))
        )

        assert remembering.routed.count == routed_before, "no repeat of the storm was routed"
    assert {answer_of(answer) for answer in storm} == {answer_of(from_route)}
    assert count(database, "coupon_issuances") == 1


async def test_vouched_bytes_sent_as_the_route_refuses_them_are_refused_as_ever(
    stack: Stack, agent: Caller, database: str
) -> None:
    body = json.dumps(COUPON).encode()
    path = "/v1/tools/issue_coupon/calls"
    async with gateway(stack) as remembering:
        vouched = [await remembering.send(agent, "storm-0300", body) for _ in range(3)]
        assert vouched[-1].headers["Idempotent-Replayed"] == "true"
        keyed = {**agent.headers, "Idempotency-Key": "storm-0300"}

        as_text = await remembering.http.post(
            path, content=body, headers={**keyed, "Content-Type": "text/plain"}
        )
        in_latin1 = await remembering.http.post(
            path,
            content=body,
            headers={**keyed, "Content-Type": "application/json; charset=latin-1"},
        )
        two_keys = await remembering.http.post(
            path,
            content=body,
            headers=[
                *agent.headers.items(),
                ("Content-Type", "application/json"),
                ("Idempotency-Key", "storm-0300"),
                ("Idempotency-Key", "storm-0300"),
            ],
        )
        no_key = await remembering.http.post(
            path, content=body, headers={**agent.headers, "Content-Type": "application/json"}
        )
        anonymous = await remembering.http.post(
            path,
            content=body,
            headers={"Idempotency-Key": "storm-0300", "Content-Type": "application/json"},
        )
        with_query = await remembering.http.post(
            path,
            params={"deliberate_repeat": "false"},
            content=body,
            headers={**keyed, "Content-Type": "application/json"},
        )

    refusals = {
        "as text": (as_text, 415, "unsupported-media-type"),
        "in Latin-1": (in_latin1, 415, "unsupported-media-type"),
        "two key headers": (two_keys, 400, "idempotency-key-malformed"),
        "no key": (no_key, 400, "idempotency-key-missing"),
        "no API key": (anonymous, 401, "unauthenticated"),
    }
    for what, (answer, status, problem) in refusals.items():
        assert answer.status_code == status, (what, answer.text)
        assert answer.json()["type"].endswith(problem), (what, answer.text)
        assert "Idempotent-Replayed" not in answer.headers, what
    # The route answers a query it knows the same way, as a repeat.
    assert answer_of(with_query) == answer_of(vouched[-1])
    assert count(database, "coupon_issuances") == 1
    assert count(database, "idempotency_records") == 1


async def test_a_call_of_an_open_task_repeated_is_answered_from_memory_too(
    stack: Stack, agent: Caller, database: str
) -> None:
    async with gateway(stack) as remembering:
        created = await remembering.http.post(
            "/v1/tasks", json={"open": {}}, headers={**agent.headers, "Idempotency-Key": "open-1"}
        )
        assert created.status_code == 201, created.text
        calls = f"/v1/tasks/{created.json()['task_id']}/calls"
        body = {"tool": "issue_coupon", "arguments": COUPON}
        headers = {**agent.headers, "Idempotency-Key": "open-call-1"}
        first = await remembering.http.post(calls, json=body, headers=headers)
        assert first.status_code == 200 and first.json()["ended"], first.text
        from_table = await remembering.http.post(calls, json=body, headers=headers)
        before = remembering.checkouts.count

        storm = await asyncio.gather(
            *(remembering.http.post(calls, json=body, headers=headers) for _ in range(STORM))
        )

        assert remembering.checkouts.count == before
    assert from_table.headers["Idempotent-Replayed"] == "true"
    assert {answer_of(answer) for answer in storm} == {answer_of(from_table)}
    assert count(database, "coupon_issuances") == 1


async def test_over_mcp_a_repeated_call_is_answered_from_memory_the_same_way(
    stack: Stack, agent: Caller, database: str
) -> None:
    arguments = {**COUPON, "idempotency_key": "mcp-storm-1"}
    async with gateway(stack) as remembering:
        server = build_mcp_server(remembering.service, fixed_principal(agent.principal))
        async with Client(server) as client:
            first = await client.call_tool("issue_coupon", arguments)
            from_table = await client.call_tool("issue_coupon", arguments)
            before = remembering.checkouts.count
            repeats = [await client.call_tool("issue_coupon", arguments) for _ in range(5)]
            assert remembering.checkouts.count == before, "no repeat read the database"

    assert first.meta is not None and from_table.meta is not None
    assert not first.is_error and first.meta[REPLAYED_META] is False
    assert from_table.meta[REPLAYED_META] is True
    for repeat in repeats:
        assert (repeat.content, repeat.structured_content, repeat.meta, repeat.is_error) == (
            from_table.content,
            from_table.structured_content,
            from_table.meta,
            from_table.is_error,
        )
    assert count(database, "coupon_issuances") == 1


async def test_another_body_under_a_remembered_key_is_refused_as_from_the_table(
    stack: Stack, agent: Caller, database: str
) -> None:
    other = {**COUPON, "coupon_id": "OTHER"}
    async with gateway(stack) as remembering, gateway(stack, answer_cache_size=0) as reading:
        await remembered(remembering, agent, "storm-0002")
        before = remembering.checkouts.count
        from_memory = await remembering.call(agent, "storm-0002", other)
        assert remembering.checkouts.count == before

        reads_before = reading.checkouts.count
        from_table = await reading.call(agent, "storm-0002", other)
        assert reading.checkouts.count > reads_before, "a gateway remembering nothing reads"

    assert from_memory.status_code == 422
    assert from_memory.json()["type"].endswith("idempotency-key-reused")
    assert answer_of(from_memory) == answer_of(from_table)
    assert count(database, "coupon_issuances") == 1


async def test_a_record_still_processing_is_never_answered_from_memory(
    stack: Stack, agent: Caller, database: str
) -> None:
    holding = HoldAfterClaim()
    async with (
        open_service(stack, after_claim=holding.hold) as owner,
        gateway(stack, replay_wait_seconds=0) as remembering,
    ):
        claiming = asyncio.create_task(
            owner.call_tool(agent.principal, "issue_coupon", COUPON, "storm-held")
        )
        await holding.claimed.wait()
        try:
            for _ in range(3):
                before = remembering.checkouts.count
                answer = await remembering.call(agent, "storm-held", COUPON)
                assert answer.status_code == 409, answer.text
                assert answer.json()["type"].endswith("request-in-progress")
                assert remembering.checkouts.count > before, "each repeat read the record"
        finally:
            claiming.cancel()
            await asyncio.gather(claiming, return_exceptions=True)
    assert rows(database, "SELECT state FROM idempotency_records") == [("processing",)]
    assert count(database, "coupon_issuances") == 0


async def test_a_revoked_principal_is_refused_although_its_answer_is_remembered(
    stack: Stack, agent: Caller, database: str
) -> None:
    async with gateway(stack) as remembering:
        await remembered(remembering, agent, "storm-0003")
        heard = remembering.principals.generation

        execute(
            database,
            "UPDATE api_keys SET revoked_at = now() WHERE principal_id = %s",
            agent.principal.principal_id,
        )
        await eventually(
            lambda: remembering.principals.generation > heard,
            what="the gateway heard the revocation",
        )
        refused = await remembering.call(agent, "storm-0003", COUPON)

    assert refused.status_code == 401
    assert "Idempotent-Replayed" not in refused.headers
    assert refused.json()["type"].endswith("unauthenticated")
    assert count(database, "coupon_issuances") == 1


async def test_a_pruned_record_is_not_answered_from_memory(
    stack: Stack, agent: Caller, database: str
) -> None:
    await ensure_prune_schedule(stack.client, task_queue=stack.task_queue, every=timedelta(hours=1))
    async with (
        await psycopg.AsyncConnection.connect(database, autocommit=True) as listener,
        gateway(stack) as remembering,
    ):
        await listener.execute(f"LISTEN {PRUNED_RECORDS_CHANNEL}")
        from_memory = await remembered(remembering, agent, "storm-0004")
        heard = remembering.principals.generation
        # As if its retention had passed (and its quota window, which is shorter); then
        # the worker's prune pass deletes it.
        execute(
            database,
            "UPDATE idempotency_records SET result_expires_at = now() - interval '1 s',"
            " quota_window_ends_at = now() - interval '1 s' WHERE idempotency_key = %s",
            "storm-0004",
        )
        await stack.client.get_schedule_handle(prune_schedule_id(stack.task_queue)).trigger()
        await eventually(
            lambda: count(database, "idempotency_records") == 0,
            what="the prune pass deleted the record",
        )
        # What the gateway heard is the prune pass's own notification.
        async with asyncio.timeout(HANG_SECONDS):
            notification = await anext(listener.notifies())
        assert notification.channel == PRUNED_RECORDS_CHANNEL
        await eventually(
            lambda: remembering.principals.generation > heard,
            what="the gateway heard of the prune pass",
        )
        before = remembering.checkouts.count

        retry = await remembering.call(agent, "storm-0004", COUPON)

        assert remembering.checkouts.count > before, "the retry met the table"
    # A new claim: it attached to the task Temporal still keeps (its fingerprint matches),
    # whose result it answers; the record exists again.
    assert retry.status_code == 200 and retry.json() == from_memory.json()
    assert rows(database, "SELECT state FROM idempotency_records") == [("succeeded",)]
    assert count(database, "coupon_issuances") == 1
