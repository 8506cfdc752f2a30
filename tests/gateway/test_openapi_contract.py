"""The OpenAPI document against what the gateway really answers.

A ``onceflow gateway`` process is driven through each documented route's main answers
(the requests of the boundary's other tests: keys missing, malformed or reused, bodies
invalid or too large or not JSON, tools not allowed, tasks unknown, decisions refused or
conflicting, calls refused, quota spent, a claim in progress, replays), then a gateway
whose Temporal and PostgreSQL go down. Every answer's route, status, headers, media
type and problem ``type`` must be in the document, with the headers it calls required;
and the main answers must all have been seen, so the drive cannot quietly shrink. The
docs pages must load with nothing from outside the gateway.
"""

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from onceflow.errors import ANSWERED_ERRORS
from onceflow.gateway.http_api import build_app
from onceflow.tools.worker import CATALOGUE
from tests.harness import eventually

from .conftest import (
    Caller,
    GatewayProcess,
    HoldAfterClaim,
    Stack,
    make_caller,
    new_tenant,
    open_service,
    start_gateway,
)
from .outages import fragile_boundary, served


def _no_service() -> Any:
    raise AssertionError("the OpenAPI document is built without a service")


SPEC = build_app(_no_service).openapi()
GATEWAY_HEADERS = (
    "Content-Location",
    "Location",
    "Retry-After",
    "Idempotent-Replayed",
    "WWW-Authenticate",
)
"""The response headers the gateway sets itself (the rest are HTTP's and uvicorn's)."""
COUPON = {"user_id": "u-contract", "coupon_id": "WELCOME10"}
RELEASE = {"service": "checkout", "version": "2.4.1", "environment": "production"}


def _route_patterns() -> list[tuple[re.Pattern[str], str]]:
    # Literal paths first: a named tool's route is matched before the generic one.
    paths = sorted(SPEC["paths"], key=lambda path: "{" in path)
    return [
        (re.compile("^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(path)) + "$"), path)
        for path in paths
    ]


ROUTES = _route_patterns()


@dataclass(frozen=True)
class Answer:
    """One answer the gateway gave, as the document would name it."""

    method: str
    route: str
    status: int
    headers: frozenset[str]
    media_type: str
    problem_type: str | None


class Observed:
    """Every answer given to a client whose ``response`` hook this is."""

    def __init__(self) -> None:
        self.answers: list[Answer] = []

    async def __call__(self, response: httpx.Response) -> None:
        await response.aread()
        path = response.request.url.path
        route = next((template for pattern, template in ROUTES if pattern.match(path)), path)
        media_type = response.headers.get("content-type", "").split(";")[0]
        problem = response.json().get("type") if media_type.endswith("problem+json") else None
        self.answers.append(
            Answer(
                method=response.request.method.lower(),
                route=route,
                status=response.status_code,
                headers=frozenset(
                    name for name in GATEWAY_HEADERS if name.lower() in response.headers
                ),
                media_type=media_type,
                problem_type=problem,
            )
        )

    def seen(self) -> set[tuple[str, str, int]]:
        return {(answer.method, answer.route, answer.status) for answer in self.answers}


def undocumented(answer: Answer) -> list[str]:
    """What of ``answer`` the document does not say (empty when it says all of it)."""
    where = f"{answer.method.upper()} {answer.route} {answer.status}"
    operation = SPEC["paths"].get(answer.route, {}).get(answer.method)
    if operation is None:
        return [f"{answer.method.upper()} {answer.route} is not documented"]
    documented = operation["responses"].get(str(answer.status))
    if documented is None:
        return [f"{where}: status not documented"]
    gaps = []
    headers = documented.get("headers", {})
    gaps += [f"{where}: header {name} not documented" for name in answer.headers - set(headers)]
    gaps += [
        f"{where}: documented as always sending {name}"
        for name, header in headers.items()
        if header.get("required") and name not in answer.headers
    ]
    content = documented.get("content", {})
    if answer.media_type not in content:
        gaps.append(f"{where}: media type {answer.media_type} not documented")
    elif answer.problem_type is not None:
        schema = content[answer.media_type]["schema"]
        if answer.problem_type not in schema["properties"]["type"]["enum"]:
            gaps.append(f"{where}: problem type {answer.problem_type} not documented")
    return gaps


MAIN_ANSWERS = {
    ("get", "/healthz", 200),
    ("get", "/readyz", 200),
    ("get", "/readyz", 503),
    ("get", "/v1/tools", 200),
    ("get", "/v1/tools", 401),
    ("get", "/v1/tools", 503),
    *(
        ("post", "/v1/tools/issue_coupon/calls", status)
        for status in (200, 400, 401, 409, 413, 415, 422, 429, 503)
    ),
    ("post", "/v1/tools/charge_payment/calls", 403),
    ("post", "/v1/tools/{tool}/calls", 404),
    *(("post", "/v1/tasks", status) for status in (201, 202, 400, 404, 503)),
    *(("get", "/v1/tasks/{task_id}", status) for status in (200, 400, 404, 503)),
    *(("post", "/v1/tasks/{task_id}/calls", status) for status in (200, 202, 404, 409, 503)),
    *(("post", "/v1/tasks/{task_id}/close", status) for status in (200, 404, 409, 503)),
    *(("post", "/v1/tasks/{task_id}/approve", status) for status in (200, 403, 409, 422, 503)),
    *(("post", "/v1/tasks/{task_id}/reconcile", status) for status in (400, 403, 409)),
}
"""The answers the drive must have seen: each route's main statuses."""


@pytest.fixture(scope="module")
def contract_gateway(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """A gateway whose bounded wait is short: a task awaiting approval answers 202 soon."""
    gateway = start_gateway(
        stack,
        tmp_path_factory.mktemp("contract") / "gateway.log",
        ONCEFLOW_GATEWAY_REPLAY_WAIT_SECONDS="1",
    )
    yield gateway
    gateway.stop()


@pytest.fixture
async def observing() -> AsyncIterator[tuple[httpx.AsyncClient, Observed]]:
    observed = Observed()
    async with httpx.AsyncClient(timeout=60, event_hooks={"response": [observed]}) as client:
        yield client, observed


async def test_every_answer_the_gateway_gives_is_in_its_openapi_document(
    stack: Stack,
    contract_gateway: GatewayProcess,
    observing: tuple[httpx.AsyncClient, Observed],
    database: str,
) -> None:
    http, observed = observing
    url = contract_gateway.url
    tenant = new_tenant()
    tools = ("issue_coupon", "create_order", "start_deployment")
    agent = await make_caller(database, tenant=tenant, tools=tools)
    operator = await make_caller(database, tenant=tenant, name="ops", may_decide=True)
    limited = await make_caller(database, tenant=new_tenant(), tools=tools, key_quota=1)

    await _drive_operations_and_tools(http, url, agent, limited)
    plan, open_task, deploy_digest = await _drive_tasks_and_calls(http, url, agent)
    await _drive_decisions(http, url, agent, operator, plan, open_task, deploy_digest)
    await _drive_close(http, url, agent, plan, open_task)
    await _drive_a_claim_in_progress(stack, http, url, agent)
    await _drive_an_outage(stack, http, agent, operator, plan)

    gaps = sorted({gap for answer in observed.answers for gap in undocumented(answer)})
    assert gaps == [], "\n".join(gaps)
    missing = MAIN_ANSWERS - observed.seen()
    assert not missing, f"the drive no longer reaches {sorted(missing)}"


def keyed(caller: Caller, key: str, **extra: str) -> dict[str, str]:
    return {**caller.headers, "Idempotency-Key": key, **extra}


async def _drive_operations_and_tools(
    http: httpx.AsyncClient, url: str, agent: Caller, limited: Caller
) -> None:
    await http.get(f"{url}/healthz")
    await http.get(f"{url}/readyz")
    await http.get(f"{url}/v1/tools")
    await http.get(f"{url}/v1/tools", headers=agent.headers)

    coupon = f"{url}/v1/tools/issue_coupon/calls"
    await http.post(coupon, json=COUPON)
    await http.post(coupon, json=COUPON, headers=agent.headers)
    await http.post(coupon, json=COUPON, headers=keyed(agent, "bad key"))
    await http.post(coupon, json={**COUPON, "user_id": 7}, headers=keyed(agent, "coupon-bad"))
    await http.post(
        coupon,
        content=b"user_id=u-contract",
        headers=keyed(agent, "coupon-form", **{"Content-Type": "text/plain"}),
    )
    await http.post(
        coupon, json={**COUPON, "pad": "x" * 300_000}, headers=keyed(agent, "coupon-big")
    )
    await http.post(
        f"{url}/v1/tools/charge_payment/calls", json={}, headers=keyed(agent, "charge-1")
    )
    await http.post(f"{url}/v1/tools/no_such_tool/calls", json={}, headers=keyed(agent, "x-1"))

    first = await http.post(coupon, json=COUPON, headers=keyed(agent, "coupon-1"))
    task_id = first.json()["task_id"]
    await eventually(
        lambda: http.get(f"{url}/v1/tasks/{task_id}", headers=agent.headers),
        until=lambda status: status.json()["state"] == "succeeded",
        what="the coupon task ended",
    )
    await http.post(coupon, json=COUPON, headers=keyed(agent, '"coupon-1"'))
    await http.post(coupon, json={**COUPON, "coupon_id": "OTHER"}, headers=keyed(agent, "coupon-1"))

    await http.post(coupon, json=COUPON, headers=keyed(limited, "quota-1"))
    await http.post(coupon, json=COUPON, headers=keyed(limited, "quota-2"))


async def _drive_tasks_and_calls(
    http: httpx.AsyncClient, url: str, agent: Caller
) -> tuple[str, str, str]:
    """The plan (awaiting approval), the open task and its deployment call's digest."""
    tasks = f"{url}/v1/tasks"
    deploy_step = {"step_id": "deploy", "tool": "start_deployment", "arguments": RELEASE}
    plan = await http.post(tasks, json={"steps": [deploy_step]}, headers=keyed(agent, "plan-1"))
    await http.post(
        tasks,
        json={"steps": [{**deploy_step, "tool": "no_such_tool"}]},
        headers=keyed(agent, "plan-2"),
    )
    await http.post(tasks, json={"steps": []}, headers=keyed(agent, "plan-3"))
    opened = await http.post(tasks, json={"open": {}}, headers=keyed(agent, "open-1"))
    await http.post(tasks, json={"open": {}}, headers=keyed(agent, "open-1"))
    plan_id, open_id = plan.json()["task_id"], opened.json()["task_id"]

    await http.get(f"{tasks}/{plan_id}", headers=agent.headers)
    await http.get(f"{tasks}/no-such-task", headers=agent.headers)
    await http.get(f"{tasks}/{'x' * 1001}", headers=agent.headers)

    calls = f"{tasks}/{open_id}/calls"
    coupon_call = {"tool": "issue_coupon", "arguments": COUPON}
    await eventually(
        lambda: http.post(calls, json=coupon_call, headers=keyed(agent, "call-1")),
        until=lambda answer: answer.status_code == 200,
        what="the coupon call ended",
    )
    deployment = await http.post(
        calls,
        json={"tool": "start_deployment", "arguments": RELEASE},
        headers=keyed(agent, "call-2"),
    )
    await http.post(
        calls,
        json={"tool": "start_deployment", "arguments": RELEASE},
        headers=keyed(agent, "call-2"),
    )
    await http.post(f"{tasks}/{plan_id}/calls", json=coupon_call, headers=keyed(agent, "call-3"))
    await http.post(f"{tasks}/no-such-task/calls", json=coupon_call, headers=keyed(agent, "c-4"))
    return plan_id, open_id, deployment.json()["arguments_digest"]


async def _drive_decisions(
    http: httpx.AsyncClient,
    url: str,
    agent: Caller,
    operator: Caller,
    plan: str,
    open_task: str,
    digest: str,
) -> None:
    step = (await http.get(f"{url}/v1/tasks/{open_task}", headers=agent.headers)).json()
    [deployment] = [call for call in step["steps"] if call["tool"] == "start_deployment"]
    deny = {
        "step_id": deployment["step_id"],
        "approved": False,
        "reason": "change freeze",
        "arguments_digest": digest,
    }
    approve, reconcile = (f"{url}/v1/tasks/{open_task}/{what}" for what in ("approve", "reconcile"))
    await http.post(approve, json=deny, headers=agent.headers)
    await http.post(
        f"{url}/v1/tasks/{plan}/approve",
        json={**deny, "step_id": "deploy", "arguments_digest": "sha256:" + "0" * 64},
        headers=operator.headers,
    )
    await http.post(approve, json=deny, headers=keyed(operator, "deny-1"))
    await http.post(approve, json=deny, headers=keyed(operator, "deny-1"))
    await http.post(approve, json={**deny, "reason": "other"}, headers=keyed(operator, "deny-1"))
    await http.post(approve, json={**deny, "approved": True}, headers=keyed(operator, "allow-1"))
    await http.post(approve, json={**deny, "approved": True}, headers=keyed(operator, "allow-1"))

    found = {"step_id": "deploy", "decision": "did_not_happen", "reason": "checked"}
    await http.post(reconcile, json=found, headers=agent.headers)
    await http.post(reconcile, json={**found, "decision": "maybe"}, headers=operator.headers)
    await http.post(f"{url}/v1/tasks/{plan}/reconcile", json=found, headers=operator.headers)


async def _drive_close(
    http: httpx.AsyncClient, url: str, agent: Caller, plan: str, open_task: str
) -> None:
    await http.post(f"{url}/v1/tasks/{open_task}/close", headers=agent.headers)
    await http.post(f"{url}/v1/tasks/{plan}/close", headers=agent.headers)
    await http.post(f"{url}/v1/tasks/no-such-task/close", headers=agent.headers)
    late = {"tool": "issue_coupon", "arguments": {**COUPON, "coupon_id": "LATE"}}
    calls = f"{url}/v1/tasks/{open_task}/calls"
    await http.post(calls, json=late, headers=keyed(agent, "call-late"))
    await http.post(calls, json=late, headers=keyed(agent, "call-late"))


async def _drive_a_claim_in_progress(
    stack: Stack, http: httpx.AsyncClient, url: str, agent: Caller
) -> None:
    holding = HoldAfterClaim()
    async with open_service(stack, after_claim=holding.hold) as owner:
        claiming = asyncio.create_task(
            owner.call_tool(agent.principal, "issue_coupon", COUPON, "coupon-held")
        )
        await holding.claimed.wait()
        await http.post(
            f"{url}/v1/tools/issue_coupon/calls", json=COUPON, headers=keyed(agent, "coupon-held")
        )
        claiming.cancel()
        await asyncio.gather(claiming, return_exceptions=True)


async def _drive_an_outage(
    stack: Stack, http: httpx.AsyncClient, agent: Caller, operator: Caller, plan: str
) -> None:
    async with fragile_boundary(stack, readiness_timeout_seconds=0.5) as fragile:
        async with served(fragile.service) as url:
            await fragile.temporal.stop()
            await http.get(f"{url}/readyz")
            await http.post(
                f"{url}/v1/tools/issue_coupon/calls", json=COUPON, headers=keyed(agent, "out-1")
            )
            await http.post(f"{url}/v1/tasks", json={"open": {}}, headers=keyed(agent, "out-2"))
            await http.get(f"{url}/v1/tasks/{plan}", headers=agent.headers)
            await http.post(f"{url}/v1/tasks/{plan}/close", headers=agent.headers)
            await http.post(
                f"{url}/v1/tasks/{plan}/calls",
                json={"tool": "issue_coupon", "arguments": COUPON},
                headers=keyed(agent, "out-3"),
            )
            await http.post(
                f"{url}/v1/tasks/{plan}/approve",
                json={
                    "step_id": "deploy",
                    "approved": False,
                    "reason": "outage",
                    "arguments_digest": "sha256:" + "0" * 64,
                },
                headers=operator.headers,
            )
            await fragile.database.stop()
            await http.get(f"{url}/v1/tools", headers=agent.headers)


def test_the_document_names_only_answers_the_gateway_gives() -> None:
    """No FastAPI 422 "Validation Error" (invalid input is 400), errors only as problem
    documents, and only problem types the gateway has."""
    real = {f"urn:onceflow:problem:{kind.code}" for kind in ANSWERED_ERRORS}
    for path, operations in SPEC["paths"].items():
        for method, operation in operations.items():
            for status, answer in operation["responses"].items():
                where = f"{method.upper()} {path} {status}"
                assert answer["description"] != "Validation Error", where
                if int(status) >= 400:
                    assert set(answer["content"]) == {"application/problem+json"}, where
                    schema = answer["content"]["application/problem+json"]["schema"]
                    assert set(schema["properties"]["type"]["enum"]) <= real, where
    schemas = SPEC["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    assert set(schemas["Problem"]["properties"]["type"]["enum"]) == real
    key = SPEC["paths"]["/v1/tasks"]["post"]["parameters"][0]
    assert key["name"] == "Idempotency-Key" and key["required"] is True
    assert re.match(key["schema"]["pattern"], '"abc"') and re.match(key["schema"]["pattern"], "abc")


def test_the_status_schemas_carry_their_fields_docstrings() -> None:
    """A task's status is the workflow's own model: its fields' docstrings reach the
    document through pydantic (``use_attribute_docstrings``), cleaned up as every other
    model's are, and only those of the fields that have one."""
    schemas = SPEC["components"]["schemas"]
    described = {
        name: sorted(
            field
            for field, schema in schemas[name]["properties"].items()
            if "description" in schema
        )
        for name in ("TaskStatus", "StepStatus")
    }
    assert described == {
        "TaskStatus": ["closing", "open", "policies", "runs"],
        "StepStatus": [
            "arguments",
            "deliberate_repeat",
            "evidence",
            "key_generation",
            "provider_waited",
            "reconcile_command",
            "repeat_of",
            "waiting_for_provider",
        ],
    }
    assert schemas["StepStatus"]["properties"]["key_generation"]["description"] == (
        "The generation of the step's derived child keys: raised when an operator decides\n"
        "``did_not_happen`` while the old key can no longer be sent (the provider may have\n"
        "forgotten it, or it holds a stored failure). Look-ups search every generation."
    )


class _Assets(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [value for name, value in attrs if name in ("src", "href") and value]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_the_docs_pages_load_only_from_the_gateway(
    contract_gateway: GatewayProcess, http: httpx.AsyncClient, page: str
) -> None:
    html = await http.get(f"{contract_gateway.url}{page}")
    assert html.status_code == 200
    assert "https://" not in html.text and "http://" not in html.text
    parser = _Assets()
    parser.feed(html.text)
    scripts = [url for url in parser.urls if url.endswith(".js")]
    assert scripts and all(url.startswith("/") and not url.startswith("//") for url in parser.urls)
    for asset in parser.urls:
        answer = await http.get(f"{contract_gateway.url}{asset}")
        assert answer.status_code == 200, asset
        assert answer.content, asset
        kind = {".js": "javascript", ".css": "text/css", ".png": "image/png"}[Path(asset).suffix]
        assert kind in answer.headers["content-type"], asset
    assert "openapi.json" in html.text
    document = await http.get(f"{contract_gateway.url}/openapi.json")
    assert document.json() == SPEC


def test_tool_calls_are_routed_by_the_apps_own_routes() -> None:
    """A tool call, the most frequent request (replays included), is matched once: its
    routes are the app's own, where FastAPI matches an included router's routes twice."""
    app = build_app(_no_service)
    own = {route.path for route in app.router.routes if isinstance(route, APIRoute)}
    calls = {f"/v1/tools/{contract.name}/calls" for contract in CATALOGUE}
    assert calls, "the catalogue is empty"
    assert {"/v1/tools", "/v1/tools/{tool}/calls", *calls} <= own
    # ...in the document's order: after the operations, before the tasks.
    paths = list(SPEC["paths"])
    assert paths.index("/readyz") < paths.index("/v1/tools") < paths.index("/v1/tasks")
