"""``onceflow_client``'s exceptions and its own retries.

Against the real gateway (``build_app`` served in this process on the real stack, so each
test can give it its settings and its claim seam): every documented refusal comes back as
its own ``OnceflowError`` subclass with the problem document and a numeric
``retry_after``, is sent once, and writes nothing; a 409 request-in-progress and a 503 are
the real gateway's answers, and a retried 503 makes one effect.

Against ``httpx.MockTransport``, standing in for the gateway only where it cannot be made
to answer deterministically: a scripted run of 503, a lost answer, 429 and 409 before a
result (the retry loop and its one key), a ``Retry-After`` longer than the client waits
(the quota window's real one varies with the clock), an HTTP-date ``Retry-After``, and a
proxy's non-problem 502.
"""

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import psycopg
import pytest
from onceflow_client import (
    BackendUnavailable,
    BadRequest,
    CallRefused,
    Conflict,
    IdempotencyKeyReused,
    InvalidIdempotencyKey,
    NotFound,
    OnceflowClient,
    OnceflowError,
    PermissionDenied,
    RateLimited,
    RequestInProgress,
    Unauthenticated,
    new_idempotency_key,
)
from onceflow_client._errors import parse_retry_after

from onceflow.gateway.http_api import build_app
from onceflow.gateway.http_server import HttpServer
from tests.harness import HANG_SECONDS, eventually

from .conftest import Caller, Stack, count, make_caller, new_tenant, open_service, rows

COUPON = {"user_id": "u-errors", "coupon_id": "WELCOME10"}


class CountingTransport(httpx.AsyncBaseTransport):
    """The real network, with every request it carried and every status answered kept."""

    def __init__(self) -> None:
        self._real = httpx.AsyncHTTPTransport()
        self.sent: list[httpx.Request] = []
        self.answered: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        response = await self._real.handle_async_request(request)
        self.answered.append(response.status_code)
        return response

    async def aclose(self) -> None:
        await self._real.aclose()


@asynccontextmanager
async def gateway(
    stack: Stack, *, after_claim: Callable[[], Any] | None = None, **settings: Any
) -> AsyncIterator[str]:
    """The gateway's HTTP API with these settings on a free port; yields its URL."""
    app = build_app(lambda: open_service(stack, after_claim=after_claim, **settings))
    server = HttpServer(app, host="127.0.0.1", port=0, handle_signals=False)
    url = await server.start()
    try:
        yield url
    finally:
        await server.stop()


async def test_each_documented_refusal_is_its_own_exception_sent_once_and_writes_nothing(
    stack: Stack, agent: Caller, database: str
) -> None:
    quota_of_one = await make_caller(database, tenant=new_tenant(), key_quota=1)
    transport = CountingTransport()
    async with gateway(stack) as url:
        onceflow = OnceflowClient(url, api_key=agent.api_key, transport=transport)
        stranger = OnceflowClient(url, api_key=f"ofk_{secrets.token_urlsafe(32)}")
        limited = OnceflowClient(url, api_key=quota_of_one.api_key)
        async with onceflow, stranger, limited:
            key = new_idempotency_key()
            coupon = await onceflow.call_tool("issue_coupon", COUPON, idempotency_key=key)
            sent_before_refusals = len(transport.sent)

            async def refusal(call: Any) -> OnceflowError:
                with pytest.raises(OnceflowError) as refused:
                    await call
                return refused.value

            refused = {
                401: await refusal(
                    stranger.call_tool("issue_coupon", COUPON, idempotency_key="k-401")
                ),
                "400 key": await refusal(
                    onceflow.call_tool("issue_coupon", COUPON, idempotency_key="not a key")
                ),
                "400 body": await refusal(
                    onceflow.call_tool(
                        "issue_coupon", {"user_id": 7}, idempotency_key=new_idempotency_key()
                    )
                ),
                403: await refusal(
                    onceflow.call_tool("charge_payment", {}, idempotency_key="k-403")
                ),
                "404 tool": await refusal(
                    onceflow.call_tool("launch_rocket", {}, idempotency_key="k-404")
                ),
                "404 task": await refusal(onceflow.status("no-such-task")),
                422: await refusal(
                    onceflow.call_tool(
                        "issue_coupon", {**COUPON, "coupon_id": "OTHER"}, idempotency_key=key
                    )
                ),
            }
            refusals_sent = len(transport.sent) - sent_before_refusals  # the agent's
            async with onceflow.open_task() as task:
                pass
            refused["409 closed"] = await refusal(task.call("issue_coupon", COUPON))
            await limited.call_tool("issue_coupon", COUPON, idempotency_key="quota-1")
            # retries=0: the quota window's Retry-After is whatever is left of the minute.
            refused[429] = await refusal(
                limited.call_tool("issue_coupon", COUPON, idempotency_key="quota-2", retries=0)
            )

    kinds = {what: type(error) for what, error in refused.items()}
    assert kinds == {
        401: Unauthenticated,
        "400 key": InvalidIdempotencyKey,
        "400 body": BadRequest,
        403: PermissionDenied,
        "404 tool": NotFound,
        "404 task": NotFound,
        422: IdempotencyKeyReused,
        "409 closed": CallRefused,
        429: RateLimited,
    }
    for what, error in refused.items():
        assert error.status == error.problem["status"] == int(str(what)[:3]), what
        assert error.title and error.detail, what
        assert error.retry_after is None or what == 429, what
    assert refused[401].problem_type == "unauthenticated"
    assert isinstance(refused["400 key"], BadRequest)
    assert isinstance(refused["400 body"], BadRequest)
    assert {tuple(e["loc"]) for e in refused["400 body"].errors} == {("user_id",), ("coupon_id",)}
    assert refused[422].key_digest is not None and refused[422].key_digest.startswith("sha256:")
    assert isinstance(refused["409 closed"], Conflict)
    assert refused["409 closed"].reason
    assert refused[429].retry_after is not None and 0 < refused[429].retry_after <= 60
    # Each refusal was sent once: none is one a retry could turn into a result.
    assert refusals_sent == len([k for k in refused if k not in (401, "409 closed", 429)])
    assert coupon.state == "succeeded"
    # Two coupons: the first call's and the quota principal's first; no refusal wrote one,
    # nor reserved a key, but the call the open task refused: its key keeps the refusal.
    assert count(database, "coupon_issuances") == 2
    expected = [
        ("agent-1:issue_coupon:call", "succeeded"),
        ("agent-1:issue_coupon:call", "succeeded"),
        ("agent-1:task:call", "failed"),
        ("agent-1:task:create", "succeeded"),
    ]

    def records() -> list[tuple[str, str]]:
        found = rows(database, "SELECT scope, state FROM idempotency_records")
        return sorted((scope.split(":", 1)[1], state) for scope, state in found)

    # The closed open task records its outcome as it ends, just after its close answered.
    await eventually(records, until=lambda now: now == expected, what=lambda: f"{records()}")


class HoldOnce:
    """The claim seam: the first claim waits until released, as a slow owner would."""

    def __init__(self) -> None:
        self.claimed = asyncio.Event()
        self.release = asyncio.Event()

    async def hold(self) -> None:
        if not self.claimed.is_set():
            self.claimed.set()
            await self.release.wait()


async def test_a_request_in_progress_is_a_409_with_a_numeric_retry_after_and_one_effect(
    stack: Stack, agent: Caller, database: str
) -> None:
    held = HoldOnce()
    key = new_idempotency_key()
    async with (
        gateway(stack, after_claim=held.hold, replay_wait_seconds=0) as url,
        OnceflowClient(url, api_key=agent.api_key) as onceflow,
    ):
        first = asyncio.create_task(
            onceflow.call_tool("issue_coupon", COUPON, idempotency_key=key, retries=0)
        )
        await held.claimed.wait()
        with pytest.raises(RequestInProgress) as busy:
            await onceflow.call_tool("issue_coupon", COUPON, idempotency_key=key, retries=0)
        held.release.set()
        # replay_wait_seconds=0: the owner answers as soon as the task started, too.
        task = await onceflow.wait(await first, poll_interval=0.1, timeout=HANG_SECONDS)

    assert isinstance(busy.value, Conflict)
    assert busy.value.status == 409
    # What is left of the owner's claim lease (30 s by default), as a number.
    assert isinstance(busy.value.retry_after, float) and 1 <= busy.value.retry_after <= 30
    assert task.state == "succeeded"
    assert count(database, "coupon_issuances") == 1


class FailOnce:
    """The claim seam: the first claim's owner loses the database, as in an outage."""

    def __init__(self) -> None:
        self.failed = False

    async def fail(self) -> None:
        if not self.failed:
            self.failed = True
            raise psycopg.OperationalError("the database went away (injected)")


async def test_a_503_is_retried_by_the_client_under_the_same_key_and_makes_one_effect(
    stack: Stack, agent: Caller, database: str
) -> None:
    outage = FailOnce()
    transport = CountingTransport()
    key = new_idempotency_key()
    # A short claim lease, so the retry may take over the claim the failed owner left.
    async with (
        gateway(stack, after_claim=outage.fail, claim_lease_seconds=1) as url,
        OnceflowClient(url, api_key=agent.api_key, transport=transport) as onceflow,
    ):
        task = await onceflow.call_tool("issue_coupon", COUPON, idempotency_key=key)

    assert outage.failed
    # The 503 (its Retry-After waited), maybe a 409 while the failed owner's lease ran
    # out, then the task's result: all one request under one key.
    assert transport.answered[0] == 503 and transport.answered[-1] == 200, transport.answered
    assert set(transport.answered[1:-1]) <= {409}, transport.answered
    assert {request.headers["Idempotency-Key"] for request in transport.sent} == {key}
    assert {request.content for request in transport.sent} == {transport.sent[0].content}
    assert task.state == "succeeded"
    assert count(database, "coupon_issuances") == 1
    assert rows(database, "SELECT count(*) FROM idempotency_records") == [(1,)]


# ── shapes the real gateway cannot be made to answer on cue (httpx.MockTransport) ────


class ScriptedGateway:
    """Answers each request with the next of ``script`` (a response, or an error raised
    as the network would), keeping every request."""

    def __init__(self, *script: httpx.Response | Exception) -> None:
        self._script = list(script)
        self.sent: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        answer = self._script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    @property
    def keys(self) -> set[str]:
        return {request.headers.get("Idempotency-Key", "") for request in self.sent}


def problem(status: int, slug: str, **headers: str) -> httpx.Response:
    return httpx.Response(
        status,
        json={
            "type": f"urn:onceflow:problem:{slug}",
            "title": slug,
            "status": status,
            "detail": slug,
        },
        headers={"Content-Type": "application/problem+json", **headers},
    )


TASK = {"task_id": "t-1", "state": "succeeded", "steps": []}


def client_of(scripted: ScriptedGateway) -> OnceflowClient:
    return OnceflowClient(
        "http://gateway.test", api_key="ofk_test", transport=httpx.MockTransport(scripted)
    )


async def test_lost_answers_409_429_and_503_are_retried_under_one_key_then_raised() -> None:
    answered = ScriptedGateway(
        httpx.ReadTimeout("answer lost"),
        problem(503, "backend-unavailable", **{"Retry-After": "0"}),
        problem(429, "key-quota-exceeded", **{"Retry-After": "0"}),
        problem(409, "request-in-progress", **{"Retry-After": "0"}),
        httpx.Response(200, json=TASK),
    )
    exhausted = ScriptedGateway(*[problem(503, "backend-unavailable", **{"Retry-After": "0"})] * 3)
    async with client_of(answered) as onceflow:
        task = await onceflow.call_tool("issue_coupon", COUPON, idempotency_key="k-1", retries=4)
    async with client_of(exhausted) as onceflow:
        with pytest.raises(BackendUnavailable) as unavailable:
            await onceflow.call_tool("issue_coupon", COUPON, idempotency_key="k-2")

    assert task.state == "succeeded" and len(answered.sent) == 5
    assert answered.keys == {"k-1"}
    assert all(json.loads(request.content) == COUPON for request in answered.sent)
    # Default retries=2: three attempts, then the last refusal, with its Retry-After.
    assert len(exhausted.sent) == 3 and exhausted.keys == {"k-2"}
    assert unavailable.value.retry_after == 0.0


async def test_a_retry_after_longer_than_the_client_waits_is_raised_at_once() -> None:
    in_two_minutes = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    quota = ScriptedGateway(problem(429, "key-quota-exceeded", **{"Retry-After": "3600"}))
    outage = ScriptedGateway(problem(503, "backend-unavailable", **{"Retry-After": in_two_minutes}))
    proxy = ScriptedGateway(httpx.Response(502, text="<html>Bad Gateway</html>"))
    async with client_of(quota) as onceflow:
        with pytest.raises(RateLimited) as limited:
            await onceflow.call_tool("issue_coupon", COUPON, idempotency_key="k-1")
    async with client_of(outage) as onceflow:
        with pytest.raises(BackendUnavailable) as unavailable:
            await onceflow.status("t-1")
    async with client_of(proxy) as onceflow:
        with pytest.raises(OnceflowError) as bad_gateway:
            await onceflow.call_tool("issue_coupon", COUPON, idempotency_key="k-2")

    assert len(quota.sent) == len(outage.sent) == len(proxy.sent) == 1
    assert limited.value.retry_after == 3600.0
    assert unavailable.value.retry_after is not None
    assert 115 <= unavailable.value.retry_after <= 120
    assert type(bad_gateway.value) is OnceflowError
    assert bad_gateway.value.status == 502 and bad_gateway.value.problem_type == "about:blank"


def test_retry_after_is_read_as_seconds_or_an_http_date() -> None:
    now = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    assert parse_retry_after("0") == 0.0
    assert parse_retry_after(" 2 ") == 2.0
    assert parse_retry_after("1.5") == 1.5
    assert parse_retry_after("Fri, 01 May 2026 12:00:30 GMT", now=now) == 30.0
    assert parse_retry_after("Fri, 01 May 2026 11:00:00 GMT", now=now) == 0.0
    for unusable in (None, "", "-1", "nan", "inf", "soon"):
        assert parse_retry_after(unusable, now=now) is None, unusable
