"""Parsing as strict as the contract: JSON bodies only, no type coercion, one key.

A body sent as anything but JSON is 415; a value of the wrong JSON type (``"1"`` or
``true`` for an integer) is 400, in tool arguments and in request models alike; a second
``Idempotency-Key`` (another header line, or a list in one) is 400; the draft's
structured-field form ``"abc"`` is the same key as ``abc``. Every refusal writes nothing:
no record, no quota use, no business row.
"""

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from .conftest import Caller, Stack, count, make_caller, new_tenant, open_service, rows
from .outages import served

ORDER = {
    "customer_id": "c-strict",
    "currency": "eur",
    "lines": [{"sku": "mug", "quantity": 2, "unit_price_cents": 1250}],
}
ORDER_BYTES = (
    b'{"customer_id": "c-strict", "currency": "eur",'
    b' "lines": [{"sku": "mug", "quantity": 2, "unit_price_cents": 1250}]}'
)
PROBLEM = "urn:onceflow:problem:"


@pytest.fixture(scope="module")
async def gateway(stack: Stack) -> AsyncIterator[str]:
    """The HTTP API on the module's stack; yields its URL."""
    async with served(open_service(stack)) as url:
        yield url


def written(database: str) -> tuple[Any, ...]:
    """Everything a request could have written."""
    return rows(
        database,
        "SELECT (SELECT count(*) FROM idempotency_records),"
        " (SELECT count(*) FROM orders), (SELECT count(*) FROM operations)",
    )[0]


def refused_with(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem: dict[str, Any] = response.json()
    assert problem["type"] == PROBLEM + slug
    return problem


@pytest.mark.parametrize(
    "content_type",
    [
        [("Content-Type", "text/plain")],
        [("Content-Type", "application/xml")],
        [("Content-Type", "application/x-www-form-urlencoded")],
        [("Content-Type", "application/json; charset=latin-1")],
        [("Content-Type", "application/json"), ("Content-Type", "text/plain")],
        # A body that does not say what it is is not taken for JSON either.
        [],
    ],
    ids=["text", "xml", "form", "latin-1", "two", "none"],
)
async def test_a_body_not_sent_as_json_is_415_and_reserves_nothing(
    gateway: str,
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
    content_type: list[tuple[str, str]],
) -> None:
    before = written(database)
    response = await http.post(
        f"{gateway}/v1/tools/create_order/calls",
        content=ORDER_BYTES,
        headers=[*agent.headers.items(), ("Idempotency-Key", "order-415"), *content_type],
    )

    problem = refused_with(response, 415, "unsupported-media-type")
    assert "application/json" in problem["detail"]
    assert written(database) == before


@pytest.mark.parametrize(
    "media_type", ["application/json; charset=UTF-8", "application/vnd.acme.order+json"]
)
async def test_json_and_json_suffixed_types_are_read(
    gateway: str, agent: Caller, http: httpx.AsyncClient, database: str, media_type: str
) -> None:
    response = await http.post(
        f"{gateway}/v1/tools/create_order/calls",
        content=ORDER_BYTES,
        headers={**agent.headers, "Idempotency-Key": "order-json", "Content-Type": media_type},
    )

    assert response.status_code == 200, response.text
    assert count(database, "orders") == 1


def with_line(**changes: Any) -> dict[str, Any]:
    return {**ORDER, "lines": [{**ORDER["lines"][0], **changes}]}  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        ("/v1/tools/create_order/calls", with_line(quantity="2"), ["lines", 0, "quantity"]),
        ("/v1/tools/create_order/calls", with_line(quantity=True), ["lines", 0, "quantity"]),
        ("/v1/tools/create_order/calls", with_line(quantity=2.0), ["lines", 0, "quantity"]),
        ("/v1/tools/create_order/calls", {**ORDER, "customer_id": 7}, ["customer_id"]),
        (
            "/v1/tasks",
            {
                "steps": [
                    {"step_id": "1", "tool": "create_order", "arguments": with_line(quantity="2")}
                ]
            },
            ["steps", 0, "arguments", "lines", 0, "quantity"],
        ),
        (
            "/v1/tasks",
            {"steps": [{"step_id": 1, "tool": "create_order", "arguments": ORDER}]},
            ["steps", 0, "step_id"],
        ),
        (
            "/v1/tasks",
            {
                "steps": [{"step_id": "1", "tool": "create_order", "arguments": ORDER}],
                "budget": {"max_attempts_per_task": "3"},
            },
            ["budget", "max_attempts_per_task"],
        ),
        ("/v1/tasks", {"open": {"idle_timeout": True}}, ["open", "idle_timeout"]),
        ("/v1/tasks", {"open": {"idle_timeout": "60"}}, ["open", "idle_timeout"]),
    ],
    ids=[
        "string-for-integer",
        "true-for-integer",
        "float-for-integer",
        "integer-for-string",
        "step-arguments",
        "step-model",
        "budget",
        "true-for-duration",
        "numeric-string-for-duration",
    ],
)
async def test_a_value_of_another_json_type_is_400_not_coerced(
    gateway: str,
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
    path: str,
    body: dict[str, Any],
    where: list[Any],
) -> None:
    before = written(database)
    response = await http.post(
        f"{gateway}{path}", json=body, headers={**agent.headers, "Idempotency-Key": "strict-1"}
    )

    problem = refused_with(response, 400, "invalid-request")
    assert [error["loc"] for error in problem["errors"]] == [where]
    assert written(database) == before


async def test_request_models_take_no_coerced_flags_but_durations_in_seconds(
    gateway: str, database: str, http: httpx.AsyncClient
) -> None:
    operator = await make_caller(database, tenant=new_tenant(), name="ops", may_decide=True)
    task = await http.post(
        f"{gateway}/v1/tasks",
        # Seconds for a duration: documented, and what the Python client sends.
        json={"open": {"idle_timeout": 600, "max_lifetime": 3600.5}},
        headers={**operator.headers, "Idempotency-Key": "open-seconds"},
    )
    assert task.status_code == 201, task.text
    task_id = task.json()["task_id"]
    before = written(database)

    call = await http.post(
        f"{gateway}/v1/tasks/{task_id}/calls",
        json={"tool": "create_order", "arguments": ORDER, "deliberate_repeat": 1},
        headers={**operator.headers, "Idempotency-Key": "call-flag"},
    )
    approval = await http.post(
        f"{gateway}/v1/tasks/{task_id}/approve",
        json={
            "step_id": "1",
            "approved": "true",
            "reason": "looks right",
            "arguments_digest": "sha256:" + "0" * 64,
        },
        headers=operator.headers,
    )

    assert refused_with(call, 400, "invalid-request")["errors"][0]["loc"] == ["deliberate_repeat"]
    assert refused_with(approval, 400, "invalid-request")["errors"][0]["loc"] == ["approved"]
    assert written(database) == before
    status = (await http.get(f"{gateway}/v1/tasks/{task_id}", headers=operator.headers)).json()
    assert status["steps"] == [], "no call reached the task"


@pytest.mark.parametrize(
    "key_lines",
    [
        [("Idempotency-Key", "order-a"), ("Idempotency-Key", "order-b")],
        [("Idempotency-Key", "order-a"), ("Idempotency-Key", "order-a")],
        [("Idempotency-Key", "order-a, order-b")],
        [("Idempotency-Key", '"order-a", "order-b"')],
        [("Idempotency-Key", '"order-a";v=1')],
        [("Idempotency-Key", '"order-a')],
        [("Idempotency-Key", '"order\\a"')],
        [("Idempotency-Key", '""')],
    ],
    ids=[
        "two-lines",
        "two-equal-lines",
        "list",
        "sf-list",
        "sf-parameters",
        "unterminated",
        "bad-escape",
        "empty-string",
    ],
)
async def test_anything_but_one_key_is_400_and_reserves_nothing(
    gateway: str,
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
    key_lines: list[tuple[str, str]],
) -> None:
    before = written(database)
    response = await http.post(
        f"{gateway}/v1/tools/create_order/calls",
        json=ORDER,
        headers=[*agent.headers.items(), *key_lines],
    )

    problem = refused_with(response, 400, "idempotency-key-malformed")
    assert "order-a" not in response.text, "the key is never echoed"
    assert problem["detail"]
    assert written(database) == before


async def test_the_quoted_key_is_the_same_key_as_the_bare_one(
    stack: Stack, gateway: str, agent: Caller, http: httpx.AsyncClient, database: str
) -> None:
    url = f"{gateway}/v1/tools/create_order/calls"
    quoted = await http.post(
        url, json=ORDER, headers={**agent.headers, "Idempotency-Key": '"order-sf-1"'}
    )
    bare = await http.post(
        url, json=ORDER, headers={**agent.headers, "Idempotency-Key": "order-sf-1"}
    )
    other_body = await http.post(
        url,
        json=with_line(quantity=3),
        headers={**agent.headers, "Idempotency-Key": '"order-sf-1"'},
    )

    assert quoted.status_code == 200, quoted.text
    assert "Idempotent-Replayed" not in quoted.headers
    assert bare.status_code == 200 and bare.headers["Idempotent-Replayed"] == "true"
    assert bare.content == quoted.content, "the same task and answer"
    refused_with(other_body, 422, "idempotency-key-reused")
    assert rows(database, "SELECT idempotency_key, state FROM idempotency_records") == [
        ("order-sf-1", "succeeded")
    ]
    assert count(database, "orders") == 1
    assert await stack.task_workflows(agent.principal.tenant) == 1


@pytest.mark.parametrize(
    "body",
    [
        b'{"customer_id": "c-strict", "currency": "eur", "currency": "usd", "lines": []}',
        b'{"customer_id": "c-strict", "currency": "eur", "lines": [{"quantity": NaN}]}',
        b'{"customer_id": "c-strict", "currency": "eur", "lines": [{"quantity": 1e999}]}',
    ],
    ids=["repeated-member", "nan", "infinite"],
)
async def test_json_that_parsers_read_differently_is_400(
    gateway: str, agent: Caller, http: httpx.AsyncClient, database: str, body: bytes
) -> None:
    before = written(database)
    response = await http.post(
        f"{gateway}/v1/tools/create_order/calls",
        content=body,
        headers={
            **agent.headers,
            "Idempotency-Key": "order-json-1",
            "Content-Type": "application/json",
        },
    )

    assert refused_with(response, 400, "invalid-request")["detail"] == "the body is not valid JSON"
    assert written(database) == before
