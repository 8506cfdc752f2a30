"""A gateway comes back from every PostgreSQL restart, whatever it was doing at the stop.

Two gateway processes and a worker serve one PostgreSQL server of this test's own. Each
cycle catches both gateways at their worst: requests in flight holding pooled connections
(blocked behind a table lock the test holds, so the server dies under them), a stream of
readiness probes that time out (cancelled at every point of their read), and each
gateway's connection listening for principal changes. The server stops with a fast
shutdown and starts again; then each gateway must be ready again, answer a real request
(the order it creates is in the table, and the key that got a 503 at the stop gets its
order on a retry) and listen again, before the next cycle. The cycle count is
``POOL_RECOVERY_CYCLES`` (default 3 in the suite; the done-criterion is 20 in a row).
"""

import asyncio
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from temporalio.testing import WorkflowEnvironment

from onceflow.gateway._principal_cache import APPLICATION_NAME as LISTENER_NAME
from onceflow.settings import OnceflowSettings
from onceflow.storage import apply_migrations, build_pool
from onceflow.worker import build_worker
from tests.harness import eventually
from tests.tool_configuration import builtin

from .conftest import Caller, GatewayProcess, Stack, make_caller, new_tenant, start_gateway
from .outages import Restartable

CYCLES = int(os.environ.get("POOL_RECOVERY_CYCLES", "3"))
"""Stop/start cycles in a row; the suite runs a handful, the done-criterion is 20."""
HELD_PER_GATEWAY = 4
"""Requests in flight in each gateway at every stop, each holding a pooled connection."""
BACK_WITHIN = 30.0
"""Seconds a gateway may take to be ready again: a bound for a gateway that never comes
back, many times the design's 2 s (measured and printed, not asserted)."""
CLAIM_LEASE_SECONDS = 2
"""The gateways' claim lease: a request cut after its claim committed holds the key this
long (the default 30 s would make each cycle wait for it)."""
PROBE_TIMEOUT_SECONDS = 0.05
"""The gateways' readiness timeout: short, so that probes are cancelled at every point
of their read, giving the connection back included (as 2 s does under a restart's load)."""
POOL_SIZE = HELD_PER_GATEWAY + 2
"""The gateways' pool: the held requests and two more."""
PROBES_PER_GATEWAY = 16
"""Readiness probes each gateway answers at once, all through every cycle."""
GATEWAYS = ("gateway-a", "gateway-b")
"""Each gateway's ``application_name``: which sessions in ``pg_stat_activity`` are its."""


def order(customer: str) -> dict[str, object]:
    return {
        "customer_id": customer,
        "currency": "eur",
        "lines": [{"sku": "mug", "quantity": 1, "unit_price_cents": 900}],
    }


@pytest.fixture
def postgres(tmp_path: Path) -> Iterator[Restartable]:
    server = Restartable(tmp_path / "pg")
    yield server
    server.server.stop()


@pytest.mark.timeout(120 + 60 * CYCLES)
async def test_both_gateways_come_back_after_every_restart_under_load(
    postgres: Restartable, dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    await apply_migrations(postgres.url)
    agent = await make_caller(postgres.url, tenant=new_tenant())
    stack = Stack(
        postgres_url=postgres.url,
        temporal_address=dev_server.client.service_client.config.target_host,
        task_queue=f"pool-recovery-{uuid.uuid4().hex[:10]}",
        client=dev_server.client,
    )
    settings = OnceflowSettings(task_queue=stack.task_queue, shutdown_grace_seconds=2)
    gateways = {
        name: start_gateway(
            stack,
            tmp_path / f"{name}.log",
            DATABASE_URL=make_conninfo(postgres.url, application_name=name),
            # A claim whose request the stop cut is taken over by its retry this soon.
            ONCEFLOW_GATEWAY_CLAIM_LEASE_SECONDS=str(CLAIM_LEASE_SECONDS),
            # Probes that time out often, on a small pool: the cancelled reads that once
            # lost connections until the pool had none (issue #39).
            ONCEFLOW_GATEWAY_READINESS_TIMEOUT_SECONDS=str(PROBE_TIMEOUT_SECONDS),
            ONCEFLOW_GATEWAY_DB_POOL_MAX_SIZE=str(POOL_SIZE),
        )
        for name in GATEWAYS
    }
    recovered: list[float] = []
    try:
        async with (
            build_pool(postgres.url, max_size=4) as pool,
            build_worker(dev_server.client, pool, settings, tools=builtin()),
            httpx.AsyncClient(timeout=60) as http,
        ):
            for name, gateway in gateways.items():
                await created_order(http, gateway, agent, f"{name}-before", postgres.url)
            probing = asyncio.Event()
            probes = [
                asyncio.create_task(probe(http, gateway, probing))
                for gateway in gateways.values()
                for _ in range(PROBES_PER_GATEWAY)
            ]
            try:
                for cycle in range(CYCLES):
                    recovered += await restart_under_load(postgres, gateways, http, agent, cycle)
            finally:
                probing.set()
                await asyncio.gather(*probes)
    finally:
        for gateway in gateways.values():
            gateway.stop()
    print(
        f"{CYCLES} cycles: each gateway ready again {min(recovered):.2f}–{max(recovered):.2f} s"
        f" after the server (mean {sum(recovered) / len(recovered):.2f} s)"
    )


async def restart_under_load(
    postgres: Restartable,
    gateways: dict[str, GatewayProcess],
    http: httpx.AsyncClient,
    agent: Caller,
    cycle: int,
) -> list[float]:
    """One stop/start with connections held in both gateways; returns the seconds each
    gateway took to be ready again after the server was."""
    await eventually(
        lambda: listeners(postgres.url),
        until=lambda count: count == len(gateways),
        what=f"cycle {cycle}: every gateway listens for principal changes before the stop",
    )
    in_flight: dict[str, list[asyncio.Task[httpx.Response]]] = {}
    lock = await psycopg.AsyncConnection.connect(postgres.url)
    try:
        # Every claim and every readiness read waits behind this lock, holding its
        # connection, until the server ends both.
        await lock.execute("LOCK TABLE idempotency_records IN ACCESS EXCLUSIVE MODE")
        for name, gateway in gateways.items():
            keys = [f"{name}-{cycle}-{i}" for i in range(HELD_PER_GATEWAY)]
            in_flight[name] = [
                asyncio.create_task(post_order(http, gateway, agent, key)) for key in keys
            ]
            in_flight[name].append(asyncio.create_task(http.get(f"{gateway.url}/readyz")))
        for name in gateways:
            await eventually(
                lambda name=name: waiting_on_the_lock(postgres.url, name),
                until=lambda waiting: waiting >= HELD_PER_GATEWAY,
                what=f"cycle {cycle}: {name} has connections for its requests (held behind"
                " the lock); a pool that lost its connections has none",
            )
        await asyncio.to_thread(postgres.stop)
    finally:
        await lock.close()
    for name, requests in in_flight.items():
        answers = await asyncio.gather(*requests)
        # The server died under them: a retryable 503 (or done, when one's statement won
        # the race with the fast shutdown), never a server error.
        assert {answer.status_code for answer in answers} <= {200, 503}, (
            name,
            [answer.text for answer in answers],
        )
    await asyncio.to_thread(postgres.start)
    back = time.monotonic()

    async def ready_again(name: str, gateway: GatewayProcess) -> float:
        await eventually(
            lambda: ready(http, gateway),
            what=lambda: f"cycle {cycle}: {name} ready again\n{gateway.log()}",
            timeout=BACK_WITHIN,
        )
        return time.monotonic() - back

    took = await asyncio.gather(*(ready_again(*gateway) for gateway in gateways.items()))
    for name, gateway in gateways.items():
        # A new key, and the key whose request the stop cut (its retry goes on).
        await created_order(http, gateway, agent, f"{name}-{cycle}-after", postgres.url)
        await created_order(http, gateway, agent, f"{name}-{cycle}-0", postgres.url)
    await eventually(
        lambda: listeners(postgres.url),
        until=lambda count: count == len(gateways),
        what=f"cycle {cycle}: every gateway listens for principal changes again",
        timeout=BACK_WITHIN,
    )
    print(f"cycle {cycle}: ready again after " + ", ".join(f"{t:.2f} s" for t in took))
    return took


async def post_order(
    http: httpx.AsyncClient, gateway: GatewayProcess, agent: Caller, key: str
) -> httpx.Response:
    return await http.post(
        f"{gateway.url}/v1/tools/create_order/calls",
        json=order(key),
        headers={**agent.headers, "Idempotency-Key": key},
    )


async def created_order(
    http: httpx.AsyncClient, gateway: GatewayProcess, agent: Caller, key: str, database: str
) -> None:
    """Order under ``key`` through ``gateway``; the order must be in ``database``. A key
    whose request was cut after its claim answers 409 until the claim's lease ends; a
    task still running after the gateway's bounded wait (a worker whose pool is still
    reconnecting) answers 202, and its status is polled as a client would."""
    answer = await eventually(
        lambda: post_order(http, gateway, agent, key),
        until=lambda answer: answer.status_code != 409,
        what=f"{key}: the claim of the request the stop cut is taken over",
        interval=0.5,
    )
    if answer.status_code == 202:
        answer = await eventually(
            lambda: http.get(gateway.url + answer.json()["status_url"], headers=agent.headers),
            until=lambda status: status.json().get("state") != "running",
            what=f"{key}: the task ends",
            interval=0.5,
        )
    assert answer.status_code == 200 and answer.json()["state"] == "succeeded", answer.text
    order_id = answer.json()["steps"][0]["resource_id"]
    async with await psycopg.AsyncConnection.connect(database) as conn:
        cursor = await conn.execute(
            "SELECT customer_id FROM orders WHERE order_id = %s::uuid", (order_id,)
        )
        assert await cursor.fetchall() == [(key,)], (key, order_id)


async def probe(http: httpx.AsyncClient, gateway: GatewayProcess, done: asyncio.Event) -> None:
    """Ask for readiness, again and again, until ``done``: a load balancer's probes."""
    while not done.is_set():
        try:
            await http.get(f"{gateway.url}/readyz")
        except httpx.TransportError:
            pass  # the gateway's answer is not what this load is for


async def ready(http: httpx.AsyncClient, gateway: GatewayProcess) -> bool:
    return (await http.get(f"{gateway.url}/readyz")).status_code == 200


async def listeners(url: str) -> int:
    """Sessions listening for principal changes (one per gateway that listens)."""
    return await sessions(url, "application_name = %s", LISTENER_NAME)


async def waiting_on_the_lock(url: str, application_name: str) -> int:
    """A gateway's sessions waiting for a lock: its connections checked out and held."""
    return await sessions(
        url, "application_name = %s AND wait_event_type = 'Lock'", application_name
    )


async def sessions(url: str, where: str, *params: object) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(
            f"SELECT count(*) FROM pg_stat_activity WHERE {where}".encode(), params
        )
        row = await cursor.fetchone()
    return row[0] if row else 0
