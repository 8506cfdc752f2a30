"""``onceflow_client`` against a live gateway, and ``onceflow principal add``."""

import subprocess
import sys

import httpx
import pytest
from onceflow_client import IdempotencyKeyReused, OnceflowClient, new_idempotency_key

from onceflow.gateway import PrincipalStore
from onceflow.storage import build_pool
from tests.harness import HANG_SECONDS

from ..conftest import repo_root
from .conftest import Caller, GatewayProcess, count, new_tenant, rows

ORDER = {
    "customer_id": "c-client",
    "currency": "usd",
    "lines": [{"sku": "tee", "quantity": 1, "unit_price_cents": 2000}],
}


class LoseFirstResponse(httpx.AsyncBaseTransport):
    """Delivers every request but drops the first response, like a timed-out network."""

    def __init__(self) -> None:
        self._real = httpx.AsyncHTTPTransport()
        self.posts = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.posts += request.method == "POST"
        response = await self._real.handle_async_request(request)
        if self.posts == 1:
            await response.aread()
            raise httpx.ReadTimeout("response lost", request=request)
        return response

    async def aclose(self) -> None:
        await self._real.aclose()


async def test_a_lost_response_is_retried_with_the_same_key_and_makes_one_order(
    gateways: tuple[GatewayProcess, GatewayProcess], agent: Caller, database: str
) -> None:
    transport = LoseFirstResponse()
    async with OnceflowClient(
        gateways[0].url, api_key=agent.api_key, transport=transport
    ) as onceflow:
        task = await onceflow.call_tool(
            "create_order", ORDER, idempotency_key=new_idempotency_key()
        )
        status = await onceflow.status(task.task_id)

    assert transport.posts == 2
    assert task.done and task.state == "succeeded"
    assert task.replayed, "the retry was answered from the first request's record"
    assert task.result["total_cents"] == 2000
    assert status["steps"][0]["arguments"] == ORDER
    assert count(database, "orders") == 1


async def test_tasks_waiting_and_refusals(
    gateways: tuple[GatewayProcess, GatewayProcess], agent: Caller, database: str
) -> None:
    async with OnceflowClient(gateways[1].url, api_key=agent.api_key) as onceflow:
        key = new_idempotency_key()
        task = await onceflow.start_task(
            [
                {
                    "step_id": "a",
                    "tool": "issue_coupon",
                    "arguments": {"user_id": "u", "coupon_id": "A"},
                },
                {"step_id": "b", "tool": "create_order", "arguments": ORDER},
            ],
            idempotency_key=key,
        )
        finished = await onceflow.wait(task, timeout=HANG_SECONDS)
        with pytest.raises(IdempotencyKeyReused) as reused:
            await onceflow.start_task(
                [
                    {
                        "step_id": "a",
                        "tool": "issue_coupon",
                        "arguments": {"user_id": "v", "coupon_id": "A"},
                    }
                ],
                idempotency_key=key,
            )

    assert finished.state == "succeeded"
    assert [step["state"] for step in finished.steps] == ["succeeded", "succeeded"]
    assert reused.value.status == 422
    assert reused.value.problem_type == "idempotency-key-reused"
    assert count(database, "coupon_issuances") == 1
    assert count(database, "orders") == 1


async def test_principal_add_prints_a_key_once_and_stores_only_its_digest(
    stack: object, database: str
) -> None:
    tenant = new_tenant()
    added = subprocess.run(
        [
            sys.executable,
            "-m",
            "onceflow.cli.main",
            "principal",
            "add",
            "--tenant",
            tenant,
            "--name",
            "agent-7",
            "--tools",
            "issue_coupon,create_order",
        ],
        cwd=repo_root(),
        env={"PATH": "/usr/bin:/bin", "DATABASE_URL": database},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert added.returncode == 0, added.stderr
    api_key = added.stdout.strip()
    assert api_key.startswith("ofk_")
    assert rows(database, "SELECT count(*) FROM api_keys WHERE key_hash LIKE 'sha256:%%'") == [(1,)]
    assert not rows(
        database, "SELECT 1 FROM api_keys WHERE key_hash = %s OR key_prefix = %s", api_key, api_key
    )
    async with build_pool(database, max_size=1) as pool:
        principal = await PrincipalStore(pool).authenticate(api_key)
    assert (principal.tenant, principal.name) == (tenant, "agent-7")
    assert principal.allowed_tools == {"issue_coupon", "create_order"}
    assert not principal.may_decide

    unknown = subprocess.run(
        [
            sys.executable,
            "-m",
            "onceflow.cli.main",
            "principal",
            "add",
            "--tenant",
            tenant,
            "--name",
            "agent-8",
            "--tools",
            "launch_rocket",
        ],
        cwd=repo_root(),
        env={"PATH": "/usr/bin:/bin", "DATABASE_URL": database},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unknown.returncode == 2
    assert "launch_rocket" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1


def onceflow_cli(database: str, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onceflow.cli.main", *words],
        cwd=repo_root(),
        env={"PATH": "/usr/bin:/bin", "DATABASE_URL": database, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_principal_add_approvals_makes_an_approver_the_listing_tells_apart(
    database: str,
) -> None:
    tenant = new_tenant()
    added = onceflow_cli(
        database, "principal", "add", "--tenant", tenant, "--name", "screen", "--approvals"
    )
    operator = onceflow_cli(
        database, "principal", "add", "--tenant", tenant, "--name", "ops", "--decisions"
    )
    agent = onceflow_cli(
        database, "principal", "add", "--tenant", tenant, "--name", "bot", "--tools", "*"
    )
    listed = onceflow_cli(database, "principal", "list", "--tenant", tenant)

    for done in (added, operator, agent, listed):
        assert done.returncode == 0, done.stderr
    assert "calls no tool; decides: approvals;" in added.stderr
    async with build_pool(database, max_size=1) as pool:
        approver = await PrincipalStore(pool).authenticate(added.stdout.strip())
    assert (approver.name, approver.allowed_tools) == ("screen", frozenset())
    assert approver.may_approve and approver.approves and not approver.may_decide
    lines = {line.split()[3]: line for line in listed.stdout.splitlines() if tenant in line}
    assert "approvals and reconciliations" in lines["ops"]
    assert "approvals" in lines["screen"] and "reconciliations" not in lines["screen"]
    assert "nothing" in lines["bot"] and "*" in lines["bot"]


async def test_the_same_order_under_a_new_key_is_answered_by_the_first_unless_deliberate(
    gateways: tuple[GatewayProcess, GatewayProcess], agent: Caller, database: str
) -> None:
    async with OnceflowClient(gateways[0].url, api_key=agent.api_key) as onceflow:
        first = await onceflow.call_tool(
            "create_order", ORDER, idempotency_key=new_idempotency_key()
        )
        again = await onceflow.call_tool(
            "create_order", ORDER, idempotency_key=new_idempotency_key()
        )
        second = await onceflow.call_tool(
            "create_order", ORDER, idempotency_key=new_idempotency_key(), deliberate_repeat=True
        )

    assert first.state == again.state == second.state == "succeeded"
    assert again.result["repeat_of"]["task_id"] == first.task_id
    assert again.result["order_id"] == first.result["order_id"] != second.result["order_id"]
    assert count(database, "orders") == 2
