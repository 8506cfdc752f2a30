"""A backlog of parked tasks: what thousands of them cost a worker, an operator's listing
and the parked-task gauges, and whether a decision still wakes the oldest at once.

One ``onceflow worker`` process (the real command) on the Temporal dev server and an
embedded PostgreSQL serves ``bench_transfer`` (``bench/_parking_tool.py``), whose far side
never answers: every task parks after its first attempt. The driver starts ``--tasks``
tasks (``--concurrency`` at a time, a progress line every 500) and waits until
visibility counts every one of them parked, sampling the worker's resident set size as
the backlog grows. The worker's workflow cache (Temporal's default, 1,000 workflows)
bounds what it holds: a parked task past it is evicted and replays from its history
when a decision wakes it. Then, with the whole backlog parked:

- ``onceflow tasks --state parked``: the command's wall time (the first page, 50 rows),
  next to ``onceflow --help`` (the interpreter and CLI start-up it includes);
- the parked-task gauges' scan (``scan_parked_tasks``, what a worker exporting metrics
  runs every ``ONCEFLOW_PARKED_SCAN_SECONDS``: a count and a bisection of counts for the
  oldest), next to listing every parked task (what the scan did before);
- a decision on the oldest parked task (evicted long ago): the time from sending the
  operator's ``reconcile`` Update to the task's end.

Usage: ``.venv/bin/python -m bench.parked_backlog [--tasks 10000] [--concurrency 20]``
(about 8 minutes at 10,000 on 2 cores).
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from bench._report import RESULTS, machine, run_info
from bench._servers import embedded_servers
from bench.worker_memory import rss_kib, steady_rss_kib
from onceflow.task_api import TaskClient
from onceflow.telemetry import PARKED_QUERY, scan_parked_tasks
from onceflow.workflows.task_models import (
    AgentTaskInput,
    ReconcileDecision,
    ReconcileInput,
    StepInput,
    TaskState,
)
from tests.harness import REPO, log_line

TOOL = "bench_transfer"
WORKER_READY = "onceflow worker ready on task queue "


def task(number: int) -> AgentTaskInput:
    """One task of the backlog: a transfer that parks."""
    return AgentTaskInput(
        tenant="bench",
        principal="backlog",
        steps=[StepInput(step_id="1", tool=TOOL, arguments={"reference": f"r-{number}"})],
    )


def wall_seconds(command: list[str], env: dict[str, str], runs: int = 3) -> list[float]:
    """Wall times of ``runs`` runs of a command that must succeed."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return times


async def main(tasks: int, concurrency: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        scratch = Path(directory)
        async with embedded_servers(scratch) as (database_url, env):
            task_queue = f"backlog-{uuid.uuid4().hex[:8]}"
            settings = {
                **os.environ,
                "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
                "DATABASE_URL": database_url,
                "ONCEFLOW_TASK_QUEUE": task_queue,
                "ONCEFLOW_BUILTIN_TOOLS": "issue_coupon",
                "ONCEFLOW_TOOLS": "bench._parking_tool:PARKING_TOOL",
                "ONCEFLOW_SHUTDOWN_GRACE_SECONDS": "1",
                "PYTHONPATH": str(REPO),
            }
            log = scratch / "worker.log"
            with log.open("wb") as out:
                worker = subprocess.Popen(
                    [sys.executable, "-m", "onceflow.cli.main", "worker"],
                    cwd=REPO,
                    env=settings,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            try:
                await log_line(worker, log, WORKER_READY, timeout=90)
                results = await measure(env, worker.pid, settings, task_queue, tasks, concurrency)
            finally:
                worker.terminate()
                worker.wait(timeout=60)
    results["machine"] = machine()
    results["run"] = run_info(
        n_per_arm=tasks,
        concurrency=concurrency,
        rounds=None,
        arguments={"tasks": tasks, "concurrency": concurrency},
    )
    RESULTS.mkdir(exist_ok=True)
    target = RESULTS / f"parked_backlog_of_{tasks}_tasks.json"
    target.write_text(json.dumps(results, indent=2))
    print(f"\nwritten: {target.relative_to(REPO)}")


async def measure(
    env: WorkflowEnvironment,
    worker_pid: int,
    settings: dict[str, str],
    task_queue: str,
    tasks: int,
    concurrency: int,
) -> dict[str, Any]:
    client = env.client
    task_client = TaskClient(client, task_queue=task_queue)
    idle_rss = await steady_rss_kib(worker_pid)
    print(f"worker idle: RSS {idle_rss / 1024:.1f} MiB; starting {tasks} tasks", flush=True)
    gate = asyncio.Semaphore(concurrency)
    started_at = time.monotonic()
    done = 0

    async def start(number: int) -> None:
        nonlocal done
        async with gate:
            await task_client.start(task(number), workflow_id=f"backlog-{number:06d}")
        done += 1
        if done % 500 == 0 or done == tasks:
            rate = done / (time.monotonic() - started_at)
            print(
                f"  started {done}/{tasks} ({rate:.0f}/s), worker RSS "
                f"{rss_kib(worker_pid) / 1024:.1f} MiB",
                flush=True,
            )

    await asyncio.gather(*(start(number) for number in range(tasks)))
    samples: list[tuple[int, int]] = []
    while True:
        parked = (await client.count_workflows(PARKED_QUERY)).count
        samples.append((parked, rss_kib(worker_pid)))
        print(f"  parked {parked}/{tasks}, worker RSS {samples[-1][1] / 1024:.1f} MiB", flush=True)
        if parked >= tasks:
            break
        await asyncio.sleep(5)  # a progress interval, not a wait for a condition
    filled_seconds = time.monotonic() - started_at
    full_rss = await steady_rss_kib(worker_pid)

    onceflow = [sys.executable, "-m", "onceflow.cli.main"]
    listing = wall_seconds([*onceflow, "tasks", "--state", "parked"], settings)
    startup = wall_seconds([*onceflow, "--help"], settings)
    print(f"onceflow tasks --state parked: {min(listing):.2f} s (start-up {min(startup):.2f} s)")

    scans, listings = [], []
    for _ in range(3):
        began = time.perf_counter()
        counted, _oldest = await scan_parked_tasks(client)
        scans.append(time.perf_counter() - began)
        began = time.perf_counter()
        listed = len([execution async for execution in client.list_workflows(PARKED_QUERY)])
        listings.append(time.perf_counter() - began)
    print(
        f"parked-task scan: {statistics.median(scans):.2f} s for {counted} tasks "
        f"(listing them all: {statistics.median(listings):.2f} s for {listed})"
    )

    oldest = "backlog-000000"
    began = time.perf_counter()
    await task_client.reconcile(
        oldest,
        ReconcileInput(
            step_id="1",
            decision=ReconcileDecision.HAPPENED,
            resource_id="tr-by-hand",
            operator="bench",
            reason="the transfer was found at the far side",
            unverified=True,
        ),
    )
    decided = time.perf_counter() - began
    outcome = await task_client.result(oldest)
    woken = time.perf_counter() - began
    assert outcome.state is TaskState.SUCCEEDED, outcome.state
    print(f"decision on the oldest task: accepted in {decided:.2f} s, task ended in {woken:.2f} s")
    return {
        "tasks": tasks,
        "concurrency": concurrency,
        "fill_seconds": filled_seconds,
        "worker_idle_rss_mib": idle_rss / 1024,
        "worker_rss_with_backlog_mib": full_rss / 1024,
        "rss_samples": samples,
        "workflow_cache": "Temporal's default max_cached_workflows, 1,000",
        "tasks_listing_seconds": listing,
        "cli_startup_seconds": startup,
        "parked_scan_seconds": scans,
        "parked_scan_counted": counted,
        "listing_all_parked_seconds": listings,
        "oldest_decision_accepted_seconds": decided,
        "oldest_task_ended_seconds": woken,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=20)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.tasks, arguments.concurrency))
