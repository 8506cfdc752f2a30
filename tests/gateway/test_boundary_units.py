"""The boundary's pure parts: fingerprints, the error tree, records, views, MCP tools."""

import ast
import inspect
import json
import re
import textwrap
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from fastapi import Request
from hypothesis import given
from hypothesis import strategies as st

from onceflow import errors, gateway
from onceflow.errors import OnceflowError
from onceflow.gateway import request_fingerprint
from onceflow.gateway._http_json import SortedJSONResponse, read_json
from onceflow.gateway.mcp_server import IDEMPOTENCY_KEY_ARGUMENT, tool_definition
from onceflow.idempotency import IdempotencyRecord, RecordState, stored_outcome, task_view
from onceflow.retry_policy import RetryBudget
from onceflow.tools.worker import CATALOGUE, IDEMPOTENCY_KEY_PATTERN
from onceflow.workflows.task_models import (
    BudgetStatus,
    StepState,
    StepStatus,
    TaskState,
    TaskStatus,
)

BASE = {
    "operation": "tools.call",
    "scope": "acme:agent-1:create_order:call",
    "route": "POST /v1/tools/create_order/calls",
    "body": {"customer_id": "c-1", "lines": [{"sku": "a", "quantity": 1}]},
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=10,
)


def test_a_fingerprint_is_versioned_and_covers_every_behaviour_affecting_input() -> None:
    fingerprint = request_fingerprint(**BASE)  # type: ignore[arg-type]
    assert fingerprint.startswith("v1:") and len(fingerprint) == 3 + 64
    variants = [
        {**BASE, "operation": "tasks.create"},
        {**BASE, "scope": "acme:agent-2:create_order:call"},
        {**BASE, "route": "POST /v1/tools/issue_coupon/calls"},
        {**BASE, "body": {**BASE["body"], "customer_id": "c-2"}},  # type: ignore[dict-item]
    ]
    fingerprints = {request_fingerprint(**variant) for variant in variants}  # type: ignore[arg-type]
    fingerprints.add(request_fingerprint(**BASE, api_version="2"))  # type: ignore[arg-type]
    assert fingerprint not in fingerprints
    assert len(fingerprints) == len(variants) + 1


def test_a_fingerprint_is_the_same_in_every_release() -> None:
    """Records stored by an earlier gateway must match the same request sent again: the
    canonical form is pinned, non-ASCII text and every JSON type included."""
    assert request_fingerprint(**BASE) == (  # type: ignore[arg-type]
        "v1:18b7a5f1300725aed148b0a2149e4f76bd17b1bb3f45b08158500afbd3b442f8"
    )
    body = {"user_id": "u-1", "coupon_id": "WELCOME", "note": "café ✓", "n": [1, 2.5, None, True]}
    assert request_fingerprint(
        operation="tools.call",
        scope="acme:agent:issue_coupon:call",
        route="POST /v1/tools/issue_coupon/calls",
        body=body,
    ) == ("v1:f093e75da9f2609d7d507150021dddb592518f330c4caf5c5088ed0128dd28f0")


@given(body=st.dictionaries(st.text(max_size=6), json_values, max_size=5))
def test_an_answer_is_written_as_compact_sorted_utf8_json(body: dict[str, object]) -> None:
    """What a replay answers is what its first request answered, byte for byte."""
    written = SortedJSONResponse(body).body
    assert written == json.dumps(
        body, ensure_ascii=False, sort_keys=True, separators=(",", ":")
    ).encode("utf-8")
    assert json.loads(written) == body


async def _read(body: bytes) -> object:
    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "headers": [(b"content-type", b"application/json")],
    }
    return await read_json(Request(scope, receive))


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": 1, "b": [1.5, "x", null, true]}',
        '{"note": "café ✓"}'.encode("utf-16"),
        '{"note": "café"}'.encode("utf-8-sig"),
        b'"\\ud800"',
    ],
)
async def test_a_body_is_read_as_pythons_json_reads_it(body: bytes) -> None:
    assert await _read(body) == json.loads(body)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"a": 1, "a": 2}', "an object names the same member twice"),
        (b'{"a": NaN}', "NaN is not a JSON value"),
        (b'{"a": 1e999}', "a number too large for a double"),
        (b'{"a": ', "Expecting value"),
        (b'{"a": "\xff"}', "not UTF-8"),
    ],
)
async def test_a_body_that_is_not_strict_json_is_refused(body: bytes, reason: str) -> None:
    with pytest.raises(errors.InvalidRequest) as refused:
        await _read(body)
    assert refused.value.problem()["errors"] == [{"loc": [], "msg": reason}]


@given(body=st.dictionaries(st.text(max_size=6), json_values, max_size=5))
def test_a_fingerprint_ignores_key_order_only(body: dict[str, object]) -> None:
    reordered = dict(reversed(list(body.items())))
    assert request_fingerprint(**{**BASE, "body": body}) == request_fingerprint(  # type: ignore[arg-type]
        **{**BASE, "body": reordered}  # type: ignore[arg-type]
    )


def test_every_failure_mode_has_its_own_class_status_and_one_line_docstring() -> None:
    classes = list(errors.ANSWERED_ERRORS)
    defined = [
        value
        for value in vars(errors).values()
        if isinstance(value, type)
        and issubclass(value, OnceflowError)
        and value is not OnceflowError
    ]
    assert sorted(map(str, classes)) == sorted(map(str, defined))
    assert len(classes) >= 13
    assert len({cls.code for cls in classes}) == len(classes)
    for cls in classes:
        assert cls.__doc__ and "\n" not in cls.__doc__.strip(), cls
        assert 400 <= cls.status < 600
    problem = gateway.KeyReusedWithDifferentRequest("used before", key_digest="sha256:ab").problem()
    assert problem == {
        "type": "urn:onceflow:problem:idempotency-key-reused",
        "title": "Idempotency-Key reused with a different request",
        "status": 422,
        "detail": "used before",
        "key_digest": "sha256:ab",
    }


def record(**overrides: object) -> IdempotencyRecord:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    fields: dict[str, object] = {
        "scope": "s",
        "idempotency_key": "raw-secret-key",
        "request_hash": "v1:" + "0" * 64,
        "state": RecordState.PROCESSING,
        "owner_token": "o",
        "fencing_token": 1,
        "lease_expires_at": now + timedelta(seconds=5),
        "tenant": "acme",
        "principal_id": uuid.uuid4(),
        "workflow_id": "wf",
        "workflow_run_id": None,
        "workflow_started_at": None,
        "status_code": None,
        "resource_id": None,
        "response_body": {"secret": "body"},
        "result_expires_at": now + timedelta(days=1),
        "created_at": now,
        "read_at": now,
    }
    return IdempotencyRecord(**{**fields, **overrides})  # type: ignore[arg-type]


def test_lease_expiry_is_a_property_of_the_database_clock_reading() -> None:
    held = record()
    assert not held.lease_expired
    assert held.lease_left == timedelta(seconds=5)
    expired = record(read_at=datetime(2026, 1, 1, 0, 0, 6, tzinfo=UTC))
    assert expired.lease_expired and expired.lease_left == timedelta(0)
    assert "raw-secret-key" not in repr(held) and "body" not in repr(held)


def status(state: TaskState) -> TaskStatus:
    return TaskStatus(
        workflow_id="wf-1",
        tenant="acme",
        principal="agent-1",
        state=state,
        steps=[
            StepStatus(
                step_id="1",
                tool="create_order",
                state=StepState.SUCCEEDED,
                arguments={"card": "4242424242424242"},
                arguments_digest="sha256:" + "0" * 64,
                resource_id="order-1",
                result={"order_id": "order-1"},
            )
        ],
        budget=BudgetStatus(
            budget=RetryBudget(),
            attempts_used=1,
            attempts_left=11,
            operator_authorised_attempts=0,
            deadline_at=datetime(2026, 1, 1, tzinfo=UTC),
        ),
    )


def test_the_stored_outcome_is_the_view_without_arguments() -> None:
    state, status_code, body, resource_id = stored_outcome(status(TaskState.SUCCEEDED))

    assert (state, status_code, resource_id) == (RecordState.SUCCEEDED, 200, "order-1")
    assert body == task_view(status(TaskState.SUCCEEDED)).model_dump(mode="json")
    assert "4242424242424242" not in str(body)
    assert body["status_url"] == "/v1/tasks/wf-1"
    assert stored_outcome(status(TaskState.FAILED))[0] is RecordState.FAILED
    with pytest.raises(ValueError):
        stored_outcome(status(TaskState.PARKED))


@pytest.mark.parametrize("contract", list(CATALOGUE), ids=lambda contract: contract.name)
def test_mcp_tools_carry_the_contract_annotations_and_a_required_key(contract: object) -> None:
    tool = tool_definition(contract)  # type: ignore[arg-type]
    expected = contract.mcp_annotations()  # type: ignore[attr-defined]

    assert tool.annotations is not None
    assert tool.annotations.model_dump(by_alias=True, exclude_none=True) == expected
    assert IDEMPOTENCY_KEY_ARGUMENT in tool.input_schema["required"]
    assert IDEMPOTENCY_KEY_ARGUMENT in tool.input_schema["properties"]


async def test_temporals_updates_in_flight_limit_is_429_task_busy_and_an_outage_is_503() -> None:
    # The message Temporal's server sends (seen from the dev server with eleven Updates
    # held in flight on one workflow); both backends are up: not a 503.
    from temporalio.service import RPCError, RPCStatusCode

    from onceflow.errors import BackendUnavailable, TaskBusy
    from onceflow.gateway._backend import backend_errors

    full = "limit on number of concurrent in-flight updates has been reached (10)"
    with pytest.raises(TaskBusy) as busy:
        async with backend_errors():
            raise RPCError(full, RPCStatusCode.RESOURCE_EXHAUSTED, b"")
    assert (busy.value.status, busy.value.code, busy.value.retry_after_seconds) == (
        429,
        "task-busy",
        1,
    )
    with pytest.raises(BackendUnavailable) as down:
        async with backend_errors():
            raise RPCError("connection refused", RPCStatusCode.UNAVAILABLE, b"")
    assert down.value.status == 503 and not isinstance(down.value, TaskBusy)


def test_the_boundary_face_defines_each_request_as_its_own_method() -> None:
    # Go-to-definition and the API docs reach every request the transports make: no
    # public name of ``BoundaryService`` is another object's bound method set in __init__.
    init = ast.parse(textwrap.dedent(inspect.getsource(gateway.BoundaryService.__init__)))
    aliases = [
        target.attr
        for node in ast.walk(init)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute)
        for target in node.targets
        if isinstance(target, ast.Attribute) and not target.attr.startswith("_")
    ]
    assert aliases == []
    for name in ("call_tool", "create_task", "open_task", "task_status", "call_in_task"):
        assert inspect.iscoroutinefunction(getattr(gateway.BoundaryService, name)), name
    assert callable(gateway.BoundaryService.check_call)


def test_a_task_state_is_terminal_once_the_task_has_ended() -> None:
    ended = {state for state in TaskState if state.is_terminal}
    assert ended == {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CLOSED}


def test_the_key_schemas_hold_the_one_key_pattern() -> None:
    from onceflow.gateway._http_parameters import key_header

    pattern = key_header("a key")["schema"]["pattern"]
    assert re.fullmatch(pattern, "order-1:a.b_c") and re.fullmatch(pattern, '"order-1"')
    assert not re.fullmatch(pattern, "-order") and not re.fullmatch(pattern, "a b")
    schema = tool_definition(CATALOGUE.get("issue_coupon")).input_schema
    argument = schema["properties"][IDEMPOTENCY_KEY_ARGUMENT]["pattern"]
    assert argument == f"^{IDEMPOTENCY_KEY_PATTERN}$"
    for key in ("order-1:a.b_c", "-order", "a b", "é"):
        valid = re.fullmatch(IDEMPOTENCY_KEY_PATTERN, key) is not None
        assert (re.fullmatch(argument, key) is not None) == valid, key
