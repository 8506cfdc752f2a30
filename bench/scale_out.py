"""Scale-out: two workers and two gateways against one of each, on the same servers.

Each configuration runs as real processes (``onceflow worker``, ``onceflow gateway``) on
one Temporal dev server and one embedded PostgreSQL; the load is one-step
``issue_coupon`` calls over HTTP (a new Idempotency-Key each, waited to the end), spread
round-robin over the configuration's gateways by ``--concurrency`` agents. The
configurations alternate in ``--rounds`` rounds, each started afresh, so drift hits both.
Every process, both servers and the load generator share this machine's cores: the
ratio says how much of a second worker and gateway this host can use, not what more
hosts would give (BENCHMARKS.md discusses what limits throughput at a hundred times the
load).

Usage: ``.venv/bin/python -m bench.scale_out [--calls 600] [--concurrency 32] [--rounds 3]``
"""

import argparse
import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from bench._report import RESULTS, Arm, machine, run_info
from bench._servers import embedded_servers
from tests.harness import REPO, log_line_blocking

CONFIGURATIONS = {"1 worker + 1 gateway": 1, "2 workers + 2 gateways": 2}
WORKER_READY = "onceflow worker ready on task queue "
GATEWAY_READY = "onceflow gateway ready on "
ONCEFLOW = [sys.executable, "-m", "onceflow.cli.main"]


@contextmanager
def running(command: list[str], env: dict[str, str], log_file: Path, ready: str) -> Iterator[str]:
    """A process started with ``command``; yields the rest of its ready line."""
    with log_file.open("wb") as log:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        line = log_line_blocking(process, log_file, ready)
        yield line.split(ready, 1)[1].split()[0]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def configuration(copies: int, env: dict[str, str], logs: Path) -> Iterator[list[str]]:
    """``copies`` workers and gateways; yields the gateways' URLs."""
    with ExitStack() as stack:
        for number in range(copies):
            stack.enter_context(
                running([*ONCEFLOW, "worker"], env, logs / f"worker-{number}.log", WORKER_READY)
            )
        yield [
            stack.enter_context(
                running(
                    [*ONCEFLOW, "gateway", "--port", "0"],
                    env,
                    logs / f"gateway-{number}.log",
                    GATEWAY_READY,
                )
            )
            for number in range(copies)
        ]


async def drive(urls: list[str], api_key: str, calls: int, concurrency: int, arm: Arm) -> None:
    """``calls`` one-step calls over ``urls``; each latency into ``arm``."""
    targets = itertools.cycle(urls)
    numbers = iter(range(calls))
    headers = {"Authorization": f"Bearer {api_key}"}

    async def agent(http: httpx.AsyncClient) -> None:
        for number in numbers:
            url = f"{next(targets)}/v1/tools/issue_coupon/calls"
            began = time.perf_counter()
            answer = await http.post(
                url,
                json={"user_id": f"u-{uuid.uuid4().hex}", "coupon_id": "SCALE"},
                headers={**headers, "Idempotency-Key": f"scale-{uuid.uuid4().hex}"},
            )
            if answer.status_code != 200 or answer.json().get("state") != "succeeded":
                raise RuntimeError(f"call {number}: {answer.status_code} {answer.text[:200]}")
            arm.latencies.append(time.perf_counter() - began)

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        began = time.perf_counter()
        await asyncio.gather(*(agent(http) for _ in range(concurrency)))
        arm.wall_seconds += time.perf_counter() - began


async def main(calls: int, concurrency: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        scratch = Path(directory)
        async with embedded_servers(scratch) as (database_url, server):
            env = {
                **os.environ,
                "TEMPORAL_ADDRESS": server.client.service_client.config.target_host,
                "DATABASE_URL": database_url,
                "ONCEFLOW_TASK_QUEUE": f"scale-{uuid.uuid4().hex[:8]}",
                "ONCEFLOW_BUILTIN_TOOLS": "issue_coupon",
                "ONCEFLOW_SHUTDOWN_GRACE_SECONDS": "1",
                "PYTHONUNBUFFERED": "1",
            }
            api_key = subprocess.run(
                [*ONCEFLOW, "principal", "add", "--tenant", "bench", "--name", "scale"]
                + ["--tools", "issue_coupon", "--key-quota", str(10 * calls * rounds)],
                cwd=REPO,
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            arms = {name: Arm(name) for name in CONFIGURATIONS}
            for round_number in range(1, rounds + 1):
                for name, copies in CONFIGURATIONS.items():
                    logs = scratch / f"round-{round_number}-{copies}"
                    logs.mkdir()
                    with configuration(copies, env, logs) as urls:
                        # A few calls first: each process's first task pays its start-up.
                        await drive(urls, api_key, 4 * copies, 2 * copies, Arm("warm-up"))
                        await drive(urls, api_key, calls // rounds, concurrency, arms[name])
                    print(
                        f"  round {round_number}: {name}: "
                        f"{arms[name].summary()['throughput_per_s']:.1f} calls/s so far",
                        flush=True,
                    )
    report(arms, calls, concurrency, rounds)


def report(arms: dict[str, Arm], calls: int, concurrency: int, rounds: int) -> None:
    one, two = (arms[name].summary() for name in CONFIGURATIONS)
    ratios = {
        "throughput": two["throughput_per_s"] / one["throughput_per_s"],
        "p50": two["p50_ms"] / one["p50_ms"],
        "p99": two["p99_ms"] / one["p99_ms"],
    }
    print(
        f"\n== scale-out ==  ({machine()}; {calls} calls per configuration, {concurrency} agents)"
    )
    for name, numbers in zip(CONFIGURATIONS, (one, two), strict=True):
        print(
            f"  {name:<24} {numbers['throughput_per_s']:6.1f} calls/s  "
            f"p50 {numbers['p50_ms']:7.1f} ms  p99 {numbers['p99_ms']:7.1f} ms"
        )
    print(
        f"  2+2 / 1+1: throughput {ratios['throughput']:.2f}x  p50 {ratios['p50']:.2f}x  "
        f"p99 {ratios['p99']:.2f}x"
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "scale_out.json").write_text(
        json.dumps(
            {
                "title": "scale-out: two workers and two gateways vs one of each",
                "run": run_info(
                    n_per_arm=calls,
                    concurrency=concurrency,
                    rounds=rounds,
                    arguments={"calls": calls, "concurrency": concurrency, "rounds": rounds},
                ),
                **dict(zip(CONFIGURATIONS, (one, two), strict=True)),
                "ratios": ratios,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.calls, arguments.concurrency, arguments.rounds))
