"""The published OpenAPI document, fuzzed with schemathesis against a live gateway.

For every operation, schema-conforming and schema-violating requests (authenticated as
a principal allowed everything) must never get a 5xx, a refused request must write
nothing (no idempotency record, no quota use, no business row), and no error may echo
the raw idempotency key.
"""

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from onceflow.gateway.http_api import build_app

from .conftest import (
    Caller,
    GatewayProcess,
    Stack,
    make_caller,
    new_tenant,
    rows,
    start_gateway,
)


def _no_service() -> Any:
    raise AssertionError("the OpenAPI document is built without a service")


SPEC = build_app(_no_service).openapi()
SCHEMA = schemathesis.openapi.from_dict(SPEC)
POSITIVE, NEGATIVE = schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE
CASES = [
    (path, method.upper(), mode)
    for path, methods in SPEC["paths"].items()
    for method, operation in methods.items()
    # Only an operation with inputs has schema-violating requests to make.
    for mode in (
        (POSITIVE, NEGATIVE)
        if operation.get("parameters") or operation.get("requestBody")
        else (POSITIVE,)
    )
]


# Framing headers belong to the HTTP client, which refuses to send a fuzzed one (h11's
# "bad Content-Length"); the raw-socket fuzz (test_header_fuzz.py) sends those itself.
FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding", "host", "connection"})


def sendable(headers: dict[str, str] | None) -> dict[str, str]:
    """The fuzzed headers an HTTP client can send: negative cases add arbitrary ones."""
    return {
        name: value
        for name, value in (headers or {}).items()
        if name.lower() not in FRAMING_HEADERS
    }


def written(database: str) -> tuple[Any, ...]:
    """Everything a request could have written."""
    return rows(
        database,
        "SELECT (SELECT count(*) FROM idempotency_records),"
        " (SELECT count(*) FROM orders), (SELECT count(*) FROM coupon_issuances),"
        " (SELECT count(*) FROM operations)",
    )[0]


@pytest.fixture(scope="module")
def fuzzed(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A gateway whose bounded wait is short: fuzzed tasks may await approval."""
    gateway = start_gateway(
        stack,
        tmp_path_factory.mktemp("fuzz") / "gateway.log",
        ONCEFLOW_GATEWAY_REPLAY_WAIT_SECONDS="0.5",
    )
    yield gateway
    gateway.stop()


@pytest.fixture
async def anyone(database: str) -> Caller:
    """A principal that may decide tasks and call the tools whose effects are local.

    Calls to the others (payments, email, deployments) are refused with 403: their
    providers are not part of this stack, and the boundary is what is fuzzed here.
    """
    return await make_caller(
        database,
        tenant=new_tenant(),
        name="fuzzer",
        tools=("issue_coupon", "create_order"),
        may_decide=True,
    )


async def test_the_published_document_is_the_one_fuzzed(
    fuzzed: GatewayProcess, http: httpx.AsyncClient
) -> None:
    served = (await http.get(f"{fuzzed.url}/openapi.json")).json()
    assert served == SPEC
    assert {"/v1/tasks", "/v1/tools/{tool}/calls", "/v1/tasks/{task_id}"} <= set(SPEC["paths"])
    call = SPEC["paths"]["/v1/tools/{tool}/calls"]["post"]
    assert {parameter["name"] for parameter in call["parameters"]} >= {"Idempotency-Key", "tool"}
    assert {"400", "401", "403", "404", "409", "422", "429"} <= set(call["responses"])


@pytest.mark.parametrize(("path", "method", "mode"), CASES, ids=lambda value: str(value))
@settings(
    max_examples=25,
    deadline=None,
    phases=[Phase.generate],
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(data=st.data())
async def test_fuzzed_requests_get_no_5xx_and_refused_ones_write_nothing(
    fuzzed: GatewayProcess,
    anyone: Caller,
    http: httpx.AsyncClient,
    database: str,
    path: str,
    method: str,
    mode: schemathesis.GenerationMode,
    data: st.DataObject,
) -> None:
    case = data.draw(SCHEMA[path][method].as_strategy(generation_mode=mode))
    request = case.as_transport_kwargs(base_url=fuzzed.url, headers=anyone.headers)
    before = written(database)

    response = await http.request(
        request["method"],
        request["url"],
        headers=sendable(request.get("headers")),
        params=request.get("params"),
        json=request.get("json"),
        content=request.get("data"),
    )

    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert response.headers["content-type"].startswith("application/problem+json")
        assert written(database) == before, f"{response.status_code} wrote something"
    key = (request.get("headers") or {}).get("Idempotency-Key")
    if isinstance(key, str) and len(key) >= 12 and response.status_code >= 400:
        assert key not in response.text, "an error echoed the raw key"
