"""The HTTP boundary on the embedded stack: two gateway processes, one worker, real servers.

Each test asserts what is in the database and in Temporal (orders, coupons, idempotency
records, task workflows), not only what the gateway answered.
"""

import asyncio
import socket
from collections import Counter
from urllib.parse import urlsplit

import httpx
import pytest

from onceflow.tools.worker import key_digest
from tests.harness import HANG_SECONDS

from .conftest import Caller, GatewayProcess, Stack, count, make_caller, new_tenant, rows

ORDER = {
    "customer_id": "c-1",
    "currency": "eur",
    "lines": [{"sku": "mug", "quantity": 2, "unit_price_cents": 1250}],
}
COUPON = {"user_id": "u-1", "coupon_id": "WELCOME10"}
PROBLEM = "application/problem+json"


def call_url(gateway: GatewayProcess, tool: str) -> str:
    return f"{gateway.url}/v1/tools/{tool}/calls"


def key_headers(caller: Caller, key: str) -> dict[str, str]:
    return {**caller.headers, "Idempotency-Key": key}


async def test_fifty_concurrent_identical_requests_on_two_gateways_make_one_order(
    stack: Stack,
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
) -> None:
    key = "order-7dc3e9c2-0f27-4f8e-9aa1-a4b92d2f7834"
    requests = [
        http.post(
            call_url(gateways[i % 2], "create_order"), json=ORDER, headers=key_headers(agent, key)
        )
        for i in range(50)
    ]
    responses = await asyncio.gather(*requests)

    statuses = Counter(response.status_code for response in responses)
    assert statuses == {200: 50}, [r.text[:300] for r in responses if r.status_code != 200][:3]
    assert len({response.content for response in responses}) == 1, "every body is the same"
    body = responses[0].json()
    assert body["state"] == "succeeded"
    originals = [r for r in responses if r.headers.get("Idempotent-Replayed") != "true"]
    assert len(originals) == 1, "exactly one request ran the operation; the rest were replays"

    assert count(database, "orders") == 1
    assert rows(database, "SELECT order_id::text FROM orders") == [
        (body["steps"][0]["resource_id"],)
    ]
    assert rows(database, "SELECT state, fencing_token, workflow_id FROM idempotency_records") == [
        ("succeeded", 1, body["task_id"])
    ]
    assert await stack.task_workflows(agent.principal.tenant) == 1
    status = await stack.client.get_workflow_handle(body["task_id"]).describe()
    assert status.id == body["task_id"]
    for gateway in gateways:
        log = gateway.log()
        assert key not in log, "the raw key is never logged"
    assert any(key_digest(key) in gateway.log() for gateway in gateways)


async def test_same_key_with_another_body_is_refused_and_changes_nothing(
    stack: Stack,
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
) -> None:
    key = "order-reuse-1"
    first = await http.post(
        call_url(gateways[0], "create_order"), json=ORDER, headers=key_headers(agent, key)
    )
    assert first.status_code == 200
    record_before = rows(
        database, "SELECT request_hash, state, updated_at FROM idempotency_records"
    )

    other = {**ORDER, "customer_id": "c-2"}
    refused = await http.post(
        call_url(gateways[1], "create_order"), json=other, headers=key_headers(agent, key)
    )

    assert refused.status_code == 422
    assert refused.headers["content-type"].startswith(PROBLEM)
    assert refused.json()["type"] == "urn:onceflow:problem:idempotency-key-reused"
    assert key not in refused.text
    assert count(database, "orders") == 1
    assert rows(database, "SELECT customer_id FROM orders") == [("c-1",)]
    assert (
        rows(database, "SELECT request_hash, state, updated_at FROM idempotency_records")
        == record_before
    )
    assert await stack.task_workflows(agent.principal.tenant) == 1


async def test_replay_after_completion_returns_the_stored_status_and_body(
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
) -> None:
    key = "coupon-replay-1"
    first = await http.post(
        call_url(gateways[0], "issue_coupon"), json=COUPON, headers=key_headers(agent, key)
    )
    assert first.status_code == 200
    assert "Idempotent-Replayed" not in first.headers

    replays = [
        await http.post(
            call_url(gateway, "issue_coupon"), json=COUPON, headers=key_headers(agent, key)
        )
        for gateway in gateways
    ]

    stored_code, stored_body = rows(
        database, "SELECT status_code, response_body FROM idempotency_records"
    )[0]
    for replay in replays:
        assert replay.status_code == stored_code == 200
        assert replay.headers["Idempotent-Replayed"] == "true"
        assert replay.content == first.content
        assert replay.json() == stored_body
    assert count(database, "coupon_issuances") == 1
    assert first.json()["steps"][0]["result"]["already_issued"] is False


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ({}, "idempotency-key-missing"),
        ({"Idempotency-Key": ""}, "idempotency-key-missing"),
        ({"Idempotency-Key": "k" * 300}, "idempotency-key-malformed"),
        ({"Idempotency-Key": "key\twith-tab"}, "idempotency-key-malformed"),
        ({"Idempotency-Key": "key with spaces"}, "idempotency-key-malformed"),
        ({"Idempotency-Key": "-leading-dash"}, "idempotency-key-malformed"),
    ],
    ids=["missing", "empty", "300-chars", "tab", "spaces", "leading-dash"],
)
async def test_missing_or_malformed_keys_are_400_and_reserve_nothing(
    stack: Stack,
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
    headers: dict[str, str],
    problem: str,
) -> None:
    response = await http.post(
        call_url(gateways[0], "issue_coupon"), json=COUPON, headers={**agent.headers, **headers}
    )

    assert response.status_code == 400
    assert response.headers["content-type"].startswith(PROBLEM)
    assert response.json()["type"] == f"urn:onceflow:problem:{problem}"
    if headers.get("Idempotency-Key"):
        assert headers["Idempotency-Key"] not in response.text
    assert count(database, "idempotency_records") == 0
    assert count(database, "coupon_issuances") == 0


def raw_post(url: str, path: str, header_lines: list[bytes], body: bytes) -> bytes:
    """An HTTP/1.1 request written byte by byte (clients refuse control characters)."""
    parts = urlsplit(url)
    request = (
        b"POST "
        + path.encode()
        + b" HTTP/1.1\r\nHost: "
        + parts.netloc.encode()
        + b"\r\n"
        + b"".join(line + b"\r\n" for line in header_lines)
        + b"Content-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\nConnection: close\r\n\r\n"
        + body
    )
    with socket.create_connection((parts.hostname, parts.port), timeout=HANG_SECONDS) as conn:
        conn.sendall(request)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    return received


@pytest.mark.parametrize(
    "control", [b"\x01", b"\x7f", b"\x1b[31m", b"\xff"], ids=["SOH", "DEL", "ESC", "non-ASCII"]
)
async def test_keys_with_control_characters_are_400_and_reserve_nothing(
    gateways: tuple[GatewayProcess, GatewayProcess], agent: Caller, database: str, control: bytes
) -> None:
    received = await asyncio.to_thread(
        raw_post,
        gateways[0].url,
        "/v1/tools/issue_coupon/calls",
        [
            b"Authorization: Bearer " + agent.api_key.encode(),
            b"Idempotency-Key: abc" + control + b"def",
        ],
        b'{"user_id": "u-1", "coupon_id": "WELCOME10"}',
    )

    assert received.startswith(b"HTTP/1.1 400"), received[:200]
    assert b"urn:onceflow:problem:idempotency-key-malformed" in received
    assert b"abc" + control not in received
    assert count(database, "idempotency_records") == 0
    assert count(database, "coupon_issuances") == 0


async def test_unknown_tool_is_404(
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
) -> None:
    response = await http.post(
        call_url(gateways[0], "launch_rocket"), json={}, headers=key_headers(agent, "k-1")
    )

    assert response.status_code == 404
    assert response.json()["type"] == "urn:onceflow:problem:unknown-tool"
    assert count(database, "idempotency_records") == 0


async def test_a_tool_the_principal_may_not_call_is_403(
    gateways: tuple[GatewayProcess, GatewayProcess], http: httpx.AsyncClient, database: str
) -> None:
    coupons_only = await make_caller(
        database, tenant=new_tenant(), name="coupon-bot", tools=("issue_coupon",)
    )

    response = await http.post(
        call_url(gateways[0], "create_order"), json=ORDER, headers=key_headers(coupons_only, "k-1")
    )

    assert response.status_code == 403
    assert response.json()["type"] == "urn:onceflow:problem:tool-not-allowed"
    assert count(database, "idempotency_records") == 0
    assert count(database, "orders") == 0


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer ofk_not-a-real-key", "Basic dXNlcjpwYXNz"],
    ids=["none", "unknown", "basic"],
)
async def test_requests_without_a_valid_api_key_are_401(
    gateways: tuple[GatewayProcess, GatewayProcess],
    http: httpx.AsyncClient,
    database: str,
    authorization: str | None,
) -> None:
    headers = {
        "Idempotency-Key": "k-1",
        **({"Authorization": authorization} if authorization else {}),
    }

    response = await http.post(call_url(gateways[0], "issue_coupon"), json=COUPON, headers=headers)

    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert count(database, "idempotency_records") == 0


async def test_invalid_arguments_are_400_and_reserve_nothing(
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
) -> None:
    secret = "4242424242424242"
    response = await http.post(
        call_url(gateways[0], "create_order"),
        json={**ORDER, "currency": secret},
        headers=key_headers(agent, "k-invalid"),
    )

    assert response.status_code == 400
    problem = response.json()
    assert problem["type"] == "urn:onceflow:problem:invalid-request"
    assert problem["errors"][0]["loc"] == ["currency"]
    assert secret not in response.text, "a rejected value is never echoed"
    assert count(database, "idempotency_records") == 0
    # The key was not reserved: the same key with a valid body is a fresh operation.
    retry = await http.post(
        call_url(gateways[0], "create_order"), json=ORDER, headers=key_headers(agent, "k-invalid")
    )
    assert retry.status_code == 200
    assert "Idempotent-Replayed" not in retry.headers
    assert count(database, "orders") == 1


async def test_new_keys_over_the_principal_quota_are_429_but_replays_still_work(
    gateways: tuple[GatewayProcess, GatewayProcess], http: httpx.AsyncClient, database: str
) -> None:
    limited = await make_caller(database, tenant=new_tenant(), name="limited", key_quota=2)
    answers = [
        await http.post(
            call_url(gateways[0], "issue_coupon"),
            json={"user_id": f"u-{n}", "coupon_id": "Q"},
            headers=key_headers(limited, f"quota-{n}"),
        )
        for n in range(3)
    ]

    assert [answer.status_code for answer in answers] == [200, 200, 429]
    assert answers[2].json()["type"] == "urn:onceflow:problem:key-quota-exceeded"
    assert int(answers[2].headers["Retry-After"]) >= 1
    assert count(database, "idempotency_records") == 2
    assert count(database, "coupon_issuances") == 2
    replay = await http.post(
        call_url(gateways[1], "issue_coupon"),
        json={"user_id": "u-0", "coupon_id": "Q"},
        headers=key_headers(limited, "quota-0"),
    )
    assert replay.status_code == 200
    assert replay.headers["Idempotent-Replayed"] == "true"


async def test_a_task_of_two_steps_and_its_status_visible_only_to_its_tenant(
    stack: Stack,
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
) -> None:
    task = {
        "steps": [
            {"step_id": "coupon", "tool": "issue_coupon", "arguments": COUPON},
            {"step_id": "order", "tool": "create_order", "arguments": ORDER},
        ]
    }
    created = await http.post(
        f"{gateways[0].url}/v1/tasks", json=task, headers=key_headers(agent, "task-1")
    )
    assert created.status_code == 200, created.text
    body = created.json()
    assert [step["state"] for step in body["steps"]] == ["succeeded", "succeeded"]

    status = await http.get(f"{gateways[1].url}{body['status_url']}", headers=agent.headers)
    assert status.status_code == 200
    assert status.json()["steps"][1]["arguments"] == ORDER
    outsider = await make_caller(database, tenant=new_tenant(), name="agent-1")
    hidden = await http.get(f"{gateways[1].url}{body['status_url']}", headers=outsider.headers)
    assert hidden.status_code == 404
    assert count(database, "orders") == 1
    assert count(database, "coupon_issuances") == 1
    # The same key for a tool call is another scope: it does not collide with the task.
    call = await http.post(
        call_url(gateways[0], "issue_coupon"), json=COUPON, headers=key_headers(agent, "task-1")
    )
    assert call.status_code == 200
    assert call.json()["steps"][0]["result"]["already_issued"] is True
    assert count(database, "coupon_issuances") == 1
    assert await stack.task_workflows(agent.principal.tenant) == 2
