"""The MCP tools fuzzed with hypothesis through the MCP SDK's own client (in process).

Every catalogue tool (and ``onceflow_task_status``) is called with arguments and an
``idempotency_key`` that are oversize, malformed, mistyped or adversarial, mixed with
valid ones. Whatever comes in: no internal error (a refusal is a tool result carrying a
4xx problem document; only an unknown tool is a protocol error, ``INVALID_PARAMS``), a
refused call writes nothing (no idempotency record, no quota use, no business row), and
no refusal echoes the raw key.
"""

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.server import Server
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from onceflow.gateway.mcp_server import (
    IDEMPOTENCY_KEY_ARGUMENT,
    TASK_STATUS_TOOL,
    build_mcp_server,
    fixed_principal,
)
from onceflow.tools.worker import CATALOGUE

from .conftest import Caller, Stack, make_caller, new_tenant, open_service, rows

VALID: dict[str, dict[str, Any]] = {
    "issue_coupon": {"user_id": "u-1", "coupon_id": "WELCOME10"},
    "create_order": {
        "customer_id": "c-1",
        "currency": "eur",
        "lines": [{"sku": "mug", "quantity": 1, "unit_price_cents": 1100}],
    },
    "charge_payment": {
        "amount": 4200,
        "currency": "eur",
        "customer": "cus_alice",
        "payment_method": "pm_card_visa",
        "order_id": "ord-1",
    },
    "refund_payment": {"payment_intent": "pi_123", "amount": 50_000},
    "send_email": {"to": ["a@example.com"], "subject": "Hi", "body": "Hello"},
    "start_deployment": {"service": "checkout", "version": "1.2.3", "environment": "staging"},
}
"""One valid argument set per tool, for the fuzzer to mutate."""
ALLOWED = ("issue_coupon", "create_order", "charge_payment", "refund_payment", "start_deployment")
"""The fuzzing principal's tools: their calls end without a far side (payments fail with a
clear reason on this stack, deployments and big refunds wait for approval). ``send_email``
is refused (403) because its task would wait for a relay this stack does not run."""

JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=50),
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
ADVERSARIAL_TEXT = st.one_of(
    st.text(min_size=1, max_size=300),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=201, max_size=3000),
    st.sampled_from(
        [
            "",
            " ",
            "\x00",
            "k\x00ey-with-nul-0001",
            "key\r\nX-Injected: 1",
            "-leading-dash-0001",
            "k" * 201,
            "k" * 100_000,
            "../../etc/passwd-01",
            "'; DROP TABLE idempotency_records; --",
            "\u202ertl-override-0001",
            "ключ-идемпотентности-1",
            "%00%0a%0d-encoded-01",
        ]
    ),
)
VALID_KEYS = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._:-]{0,40}\Z")
KEYS = st.one_of(
    VALID_KEYS,
    VALID_KEYS,
    ADVERSARIAL_TEXT,
    JSON.filter(lambda value: not isinstance(value, str)),
)
TOOL_NAMES = st.sampled_from(
    [
        *(contract.name for contract in CATALOGUE for _ in range(3)),
        TASK_STATUS_TOOL,
        *("launch_rocket", "", "issue_coupon ", "ISSUE_COUPON", "x" * 500),
    ]
)
"""Mostly real tools (three draws in four), some names that only look like one."""


@st.composite
def arguments(draw: st.DrawFn, tool: str) -> dict[str, Any]:
    """A tool's arguments: valid, mutated field by field, or anything at all."""
    base = dict(VALID.get(tool, {"task_id": "t-1"}))
    shape = draw(st.sampled_from(["valid", "valid", "mutated", "mutated", "random"]))
    if shape == "random":
        chosen: dict[str, Any] = draw(st.dictionaries(st.text(max_size=20), JSON, max_size=6))
    else:
        chosen = base
        if shape == "mutated":
            for field in draw(st.lists(st.sampled_from([*base, "extra"]), max_size=3)):
                chosen[field] = draw(st.one_of(JSON, ADVERSARIAL_TEXT))
    if shape == "valid" or draw(st.integers(0, 9)) > 1:
        chosen[IDEMPOTENCY_KEY_ARGUMENT] = draw(KEYS)
    return chosen


def written(database: str) -> tuple[Any, ...]:
    """Everything a call could have written."""
    return rows(
        database,
        "SELECT (SELECT count(*) FROM idempotency_records),"
        " (SELECT count(*) FROM orders), (SELECT count(*) FROM coupon_issuances),"
        " (SELECT count(*) FROM operations), (SELECT count(*) FROM email_messages),"
        " (SELECT count(*) FROM deployments)",
    )[0]


@pytest.fixture
async def fuzzer(database: str) -> Caller:
    return await make_caller(database, tenant=new_tenant(), name="mcp-fuzzer", tools=ALLOWED)


@pytest.fixture
async def mcp_server(stack: Stack, fuzzer: Caller) -> AsyncIterator[Server[Any]]:
    """An MCP server on the boundary service, as the fuzzing principal.

    Each example connects its own in-memory client: the SDK's client runs an anyio task
    group, which must be entered and left in one task (a fixture's teardown is not).
    """
    async with open_service(stack, replay_wait_seconds=0.5) as service:
        yield build_mcp_server(service, fixed_principal(fuzzer.principal))


@settings(
    max_examples=300,
    deadline=None,
    phases=[Phase.generate],
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(data=st.data())
async def test_fuzzed_mcp_calls_get_no_internal_error_and_refusals_write_nothing(
    mcp_server: Server[Any], database: str, data: st.DataObject
) -> None:
    tool = data.draw(TOOL_NAMES, label="tool")
    call = data.draw(arguments(tool), label="arguments")
    key = call.get(IDEMPOTENCY_KEY_ARGUMENT)
    before = written(database)

    protocol_error: MCPError | None = None
    async with Client(mcp_server) as mcp:
        try:
            result = await mcp.call_tool(tool, call)
        except MCPError as error:
            protocol_error = error
    if protocol_error is not None:
        error = protocol_error
        event("protocol error")
        # Only a tool that does not exist is a protocol error, never an internal one.
        assert error.error.code == INVALID_PARAMS, error
        assert tool not in CATALOGUE
        assert written(database) == before
        if isinstance(key, str) and len(key) >= 12:
            assert key not in str(error)
        return

    body = result.structured_content or {}
    text = "".join(getattr(part, "text", "") for part in result.content)
    problem = result.is_error and "type" in body and "status" in body
    event(f"problem {body['type'].rsplit(':', 1)[-1]}" if problem else f"state {body.get('state')}")
    if problem:
        assert body["type"].startswith("urn:onceflow:problem:"), body
        assert 400 <= body["status"] < 500, body
        assert written(database) == before, f"a refused call ({body['type']}) wrote something"
        if isinstance(key, str) and len(key) >= 12:
            assert key not in text and key not in json.dumps(body), "a refusal echoed the key"
    else:
        # Accepted: a task's view (possibly failed for want of a provider), never a crash.
        assert "state" in body or tool == TASK_STATUS_TOOL, body
