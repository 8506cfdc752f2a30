"""A PostgreSQL restart costs its own duration, nothing more.

A gateway process and a worker share a PostgreSQL server of this test's own. Both pools
hold connections to it when it is stopped: while it is down the gateway answers 503 with
``Retry-After``; once it is back, the first requests run on checked connections, so no
request fails on a stale one and no task attempt is spent by one (each task succeeds on
its first attempt, nothing parks), judged by the orders table and the tasks' attempts.
"""

import asyncio
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import psycopg
import pytest
from temporalio.testing import WorkflowEnvironment

from onceflow.retry_policy import OutcomeClass, RetryBudget
from onceflow.settings import OnceflowSettings
from onceflow.storage import apply_migrations, build_pool
from onceflow.task_api import TaskClient
from onceflow.worker import build_worker
from onceflow.workflows.task_models import AgentTaskInput, OutcomeWriter, StepInput, TaskState
from tests.harness import HANG_SECONDS, wait_for
from tests.tool_configuration import builtin

from .conftest import Stack, make_caller, new_tenant, start_gateway
from .outages import Restartable

ORDER = {
    "customer_id": "c-restart",
    "currency": "eur",
    "lines": [{"sku": "mug", "quantity": 1, "unit_price_cents": 900}],
}


@pytest.fixture
def postgres(tmp_path: Path) -> Iterator[Restartable]:
    server = Restartable(tmp_path / "pg")
    yield server
    server.server.stop()


async def test_a_postgres_restart_fails_no_request_and_spends_no_attempt_after_it(
    postgres: Restartable, dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    await apply_migrations(postgres.url)
    tenant = new_tenant()
    agent = await make_caller(postgres.url, tenant=tenant)
    stack = Stack(
        postgres_url=postgres.url,
        temporal_address=dev_server.client.service_client.config.target_host,
        task_queue=f"restart-{uuid.uuid4().hex[:10]}",
        client=dev_server.client,
    )
    tasks = TaskClient(dev_server.client, task_queue=stack.task_queue)
    settings = OnceflowSettings(task_queue=stack.task_queue, shutdown_grace_seconds=2)
    gateway = start_gateway(stack, tmp_path / "gateway.log")
    url = f"{gateway.url}/v1/tools/create_order/calls"

    async def order(http: httpx.AsyncClient, key: str) -> httpx.Response:
        headers = {**agent.headers, "Idempotency-Key": key}
        # Each key its own order: the same order under another key is one intent.
        return await http.post(url, json={**ORDER, "customer_id": f"c-{key}"}, headers=headers)

    try:
        async with (
            build_pool(postgres.url, max_size=4) as pool,
            build_worker(dev_server.client, pool, settings, tools=builtin()),
            httpx.AsyncClient(timeout=60) as http,
        ):
            before = await order(http, "before")
            assert before.status_code == 200 and before.json()["state"] == "succeeded"

            postgres.stop()
            down = await order(http, "during")
            assert down.status_code == 503, down.text
            assert down.json()["type"] == "urn:onceflow:problem:backend-unavailable"
            assert int(down.headers["Retry-After"]) >= 1

            postgres.start()
            after = [await order(http, key) for key in ("after-1", "during", "after-2")]
            assert [response.status_code for response in after] == [200, 200, 200], [
                response.text for response in after
            ]
            task_ids = [
                before.json()["task_id"],
                *(response.json()["task_id"] for response in after),
            ]
            for task_id in task_ids:
                status = await tasks.status(task_id)
                assert status.state is TaskState.SUCCEEDED
                assert [attempt.outcome.value for attempt in status.step("1").attempts] == [
                    "succeeded"
                ], task_id
    finally:
        gateway.stop()

    with psycopg.connect(postgres.url) as conn:
        orders = conn.execute("SELECT count(*) FROM orders").fetchone()
    assert orders == (4,)


async def test_a_task_waits_out_its_databases_outage_without_spending_its_budget(
    postgres: Restartable, dev_server: WorkflowEnvironment
) -> None:
    """A step whose attempts find onceflow's database down waits for it: a budget of one
    attempt still creates the order once the server is back, nothing parks."""
    await apply_migrations(postgres.url)
    queue = f"outage-{uuid.uuid4().hex[:10]}"
    tasks = TaskClient(dev_server.client, task_queue=queue)
    one_attempt = RetryBudget(
        max_attempts_per_task=1,
        max_attempts_per_step=1,
        initial_backoff=timedelta(milliseconds=200),
        max_backoff=timedelta(seconds=1),
    )
    task = AgentTaskInput(
        tenant="acme",
        principal="agent-7",
        steps=[StepInput(step_id="1", tool="create_order", arguments=ORDER)],
        budget=one_attempt,
        outcome_writer=OutcomeWriter.NONE,
    )
    settings = OnceflowSettings(task_queue=queue, shutdown_grace_seconds=2)
    async with (
        build_pool(postgres.url, max_size=4) as pool,
        build_worker(dev_server.client, pool, settings, tools=builtin()),
    ):
        postgres.stop()
        workflow_id = f"outage-{uuid.uuid4().hex}"
        await tasks.start(task, workflow_id=workflow_id)
        waited = await wait_for(
            tasks,
            workflow_id,
            lambda status: any(a.database_unavailable for a in status.step("1").attempts),
            timeout=60,
        )
        postgres.start()
        result = await asyncio.wait_for(tasks.result(workflow_id), timeout=HANG_SECONDS)

    assert result.state is TaskState.SUCCEEDED, result.failure_reason
    attempts = result.step("1").attempts
    assert [a.database_unavailable for a in attempts[:-1]] == [True] * (len(attempts) - 1)
    assert attempts[-1].outcome is OutcomeClass.SUCCEEDED and len(attempts) >= 2
    assert "could not record" in (waited.step("1").attempts[0].reason or "")
    assert result.budget.attempts_used == 1
    with psycopg.connect(postgres.url) as conn:
        orders = conn.execute("SELECT count(*) FROM orders").fetchone()
    assert orders == (1,)


OUTAGE_SECONDS = 30
"""Longer than every wait of the pools (10 s) and their reconnection chains."""


async def test_after_a_long_outage_the_gateway_answers_as_soon_as_the_server_is_back(
    postgres: Restartable, dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    await apply_migrations(postgres.url)
    agent = await make_caller(postgres.url, tenant=new_tenant())
    stack = Stack(
        postgres_url=postgres.url,
        temporal_address=dev_server.client.service_client.config.target_host,
        task_queue=f"long-outage-{uuid.uuid4().hex[:10]}",
        client=dev_server.client,
    )
    tasks = TaskClient(dev_server.client, task_queue=stack.task_queue)
    settings = OnceflowSettings(task_queue=stack.task_queue, shutdown_grace_seconds=2)
    gateway = start_gateway(stack, tmp_path / "gateway.log")
    url = f"{gateway.url}/v1/tools/create_order/calls"
    headers = {**agent.headers, "Idempotency-Key": "before"}
    task = AgentTaskInput(
        tenant="acme",
        principal="agent-7",
        steps=[StepInput(step_id="1", tool="create_order", arguments=ORDER)],
        outcome_writer=OutcomeWriter.NONE,
    )
    try:
        async with (
            build_pool(postgres.url, max_size=4) as pool,
            build_worker(dev_server.client, pool, settings, tools=builtin()),
            httpx.AsyncClient(timeout=60) as http,
        ):
            before = await http.post(url, json=ORDER, headers=headers)
            assert before.status_code == 200, before.text
            # Agents keep sending (three at a time) through the outage and after it.
            answers: list[tuple[float, int]] = []
            back: list[float] = []

            async def agent_loop() -> None:
                # Until this agent had answers after the server's return, the last five
                # of them 200s (only a hang stops it sooner, and fails below).
                mine: list[int] = []
                while not back or mine[-5:] != [200] * 5:
                    if back and time.monotonic() - back[0] > HANG_SECONDS:
                        return
                    response = await http.post(url, json=ORDER, headers=headers)
                    answers.append((time.monotonic(), response.status_code))
                    if back and answers[-1][0] > back[0]:
                        mine.append(response.status_code)

            postgres.stop()
            stopped = time.monotonic()
            loops = [asyncio.create_task(agent_loop()) for _ in range(3)]
            # A task started during the outage, with the default budget.
            workflow_id = f"during-{uuid.uuid4().hex}"
            await tasks.start(task, workflow_id=workflow_id)
            await asyncio.sleep(OUTAGE_SECONDS)  # scenario: the server is down this long
            postgres.start()
            back.append(time.monotonic())
            await asyncio.gather(*loops)

            during = [code for at, code in answers if stopped < at < back[0]]
            assert during and set(during) == {503}, during
            after = sorted((at - back[0], code) for at, code in answers if at > back[0])
            first = next((i for i, (_, code) in enumerate(after) if code == 200), -1)
            # Answered before a caller's wait (the pool's 10 s) could have ended since the
            # server's return: the pool reconnected by itself, a request did not have to
            # wait a chain out (reconnection attempts are about 1 s apart; a loaded core
            # only slows them). Nothing fails after it.
            assert first >= 0 and after[first][0] < 10, after
            assert {code for _, code in after[first:]} == {200}, after

            result = await asyncio.wait_for(tasks.result(workflow_id), timeout=HANG_SECONDS)
    finally:
        gateway.stop()

    assert result.state is TaskState.SUCCEEDED, result.failure_reason
    assert result.step("1").attempts[-1].outcome is OutcomeClass.SUCCEEDED
    with psycopg.connect(postgres.url) as conn:
        orders = conn.execute("SELECT count(*) FROM orders").fetchone()
    assert orders == (2,)
