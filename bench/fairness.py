"""Fairness between tenants: whether one tenant's storm slows another tenant's tasks.

One ``onceflow worker`` process (the real command) serves ``bench_slow_call``
(``bench/_slow_tool.py``), a tool built on the public tool API whose far side answers
after ``--tool-seconds`` (a remote call's latency), with its task queue held to
``--limit`` activities per second (``ONCEFLOW_TASK_QUEUE_ACTIVITIES_PER_SECOND``: a
provider's documented rate, enforced by Temporal for the fleet). That limit is the
bottleneck, so a storm backlogs the queue in Temporal's matching service, where fairness
acts. Every task is a one-step task started with ``TaskClient`` (so under its tenant's
fairness key) and timed from its start to its result, open loop (each task starts on
schedule, whether the earlier ones ended or not).

Two phases per arm, on the same servers and worker: tenant B alone at ``--b-rate`` tasks
per second for ``--alone-seconds``; then B at the same rate while tenant A floods at
``--flood-factor`` times B's rate for ``--flood-seconds`` (together above the limit), after
which the backlog drains. The figure is B's p50 with A flooding over B's p50 alone.

- arm "fairness on": the dev server as ``onceflow dev`` runs it (``FAIRNESS_ON``): the
  backlog is dispatched in proportion to its tenants, and B, below its share, waits only
  for the next dispatch the limit allows.
- arm "fairness off": the same dev server with ``matching.enableFairness`` false, as the
  server ships: the fairness keys are recorded and ignored, so the backlog is first come
  first served and B's tasks queue behind A's storm (the same as tasks without a key).

What B still pays under a storm with fairness on is about one dispatch interval of the
limit (1 / ``--limit``), whatever the storm's size; the ratio is that wait over B's own
latency, so the default tool answers in 0.3 s, a payment API's usual latency, rather than
the few milliseconds of a local write. A and B together stay near 11 tasks a second: what
the two shared cores run beside the servers without the load itself becoming the wait.

Each arm gets its own servers (the setting is the server's); the arms run one after the
other, fairness on first. Results go to ``bench/results/fairness_between_tenants.json``,
then its plot.

Usage: ``.venv/bin/python -m bench.fairness [--b-rate 1] [--flood-factor 10] [--limit 8]``
(about 4 minutes with the defaults).
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._report import RESULTS, Arm, machine, pyplot, run_info
from bench._servers import running_servers
from bench._slow_tool import SECONDS_VARIABLE, SLOW_TOOL
from bench._stack import start_process, stop_process
from onceflow.task_api import TaskClient, connect_temporal
from onceflow.tools.worker import register_tools
from onceflow.workflows.task_models import AgentTaskInput, StepInput, TaskState
from tests.harness import REPO

TITLE = "fairness between tenants"
TOOL = SLOW_TOOL.name
TARGET_RATIO = 1.5
"""Issue 41's target: B's p50 with A flooding at most this multiple of B's p50 alone."""
WORKER_READY = "onceflow worker ready on task queue "


# ── the load ────────────────────────────────────────────────────────────────────────


@dataclass
class Phase:
    """One phase of an arm: the tasks' latencies by tenant, and B's by start time."""

    latencies: dict[str, list[float]] = field(default_factory=dict)
    b_timeline: list[tuple[float, float]] = field(default_factory=list)
    """(seconds since the phase began, latency) of each of B's tasks."""


async def open_loop(
    tasks: TaskClient, rates: dict[str, float], seconds: float, phase: Phase
) -> None:
    """Start each tenant's tasks at its rate for ``seconds`` (open loop), and return once
    every one of them has ended."""
    began = time.perf_counter()

    async def one(tenant: str, number: int) -> None:
        scheduled = number / rates[tenant]
        await asyncio.sleep(max(0.0, began + scheduled - time.perf_counter()))  # the schedule
        started = time.perf_counter()
        handle = await tasks.start(
            AgentTaskInput(
                tenant=tenant,
                principal="agent",
                steps=[
                    StepInput(
                        step_id="1",
                        tool=TOOL,
                        arguments={"reference": f"{tenant}-{uuid.uuid4().hex[:12]}"},
                    )
                ],
            ),
            workflow_id=f"fair-{tenant}-{uuid.uuid4().hex}",
        )
        status = await handle.result()
        latency = time.perf_counter() - started
        if status.state is not TaskState.SUCCEEDED:
            raise RuntimeError(f"a task of {tenant} ended {status.state}")
        phase.latencies.setdefault(tenant, []).append(latency)
        if tenant == "tenant-b":
            phase.b_timeline.append((started - began, latency))

    await asyncio.gather(
        *(
            one(tenant, number)
            for tenant, rate in rates.items()
            for number in range(round(rate * seconds))
        )
    )


@asynccontextmanager
async def worker_stack(
    scratch: Path, *, fairness: bool, limit: float, tool_seconds: float
) -> AsyncIterator[TaskClient]:
    """Fresh servers (fairness on or off) and one ``onceflow worker`` process serving the
    slow tool under the queue's activity limit; the task client to start tasks with."""
    async with running_servers(scratch, fairness=fairness) as servers:
        queue = f"fairness-{uuid.uuid4().hex[:8]}"
        address = servers.temporal.client.service_client.config.target_host
        worker, _ = await start_process(
            ["-m", "onceflow.cli.main", "worker"],
            {
                "TEMPORAL_ADDRESS": address,
                "DATABASE_URL": servers.postgres.url,
                "ONCEFLOW_TASK_QUEUE": queue,
                "ONCEFLOW_BUILTIN_TOOLS": "issue_coupon",
                "ONCEFLOW_TOOLS": "bench._slow_tool:SLOW_TOOL",
                "ONCEFLOW_TASK_QUEUE_ACTIVITIES_PER_SECOND": str(limit),
                "ONCEFLOW_SHUTDOWN_GRACE_SECONDS": "1",
                SECONDS_VARIABLE: str(tool_seconds),
                "PYTHONPATH": os.pathsep.join(
                    [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
                ),
            },
            scratch / f"worker-fairness-{'on' if fairness else 'off'}.log",
            WORKER_READY,
        )
        try:
            client = await connect_temporal(address=address)
            yield TaskClient(client, task_queue=queue)
        finally:
            stop_process(worker)


async def measure_arm(
    scratch: Path, *, fairness: bool, arguments: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, Phase]]:
    """Both phases of one arm; their summaries and raw phases."""
    b_rate = arguments.b_rate
    phases = {"B alone": Phase(), "B with A flooding": Phase()}
    async with worker_stack(
        scratch, fairness=fairness, limit=arguments.limit, tool_seconds=arguments.tool_seconds
    ) as tasks:
        name = f"fairness {'on' if fairness else 'off'}"
        print(f"{name}: B alone at {b_rate}/s for {arguments.alone_seconds} s", flush=True)
        await open_loop(tasks, {"tenant-b": b_rate}, arguments.alone_seconds, phases["B alone"])
        flood = b_rate * arguments.flood_factor
        print(f"{name}: B at {b_rate}/s, A flooding at {flood}/s", flush=True)
        await open_loop(
            tasks,
            {"tenant-a": flood, "tenant-b": b_rate},
            arguments.flood_seconds,
            phases["B with A flooding"],
        )
    alone = Arm("B alone", phases["B alone"].latencies["tenant-b"]).summary()
    flooded_phase = phases["B with A flooding"]
    flooded = Arm("B with A flooding", flooded_phase.latencies["tenant-b"]).summary()
    storm = Arm("A flooding", flooded_phase.latencies["tenant-a"]).summary()
    summary = {
        "B alone": alone,
        "B with A flooding": flooded,
        "A flooding": storm,
        "ratio_p50": flooded["p50_ms"] / alone["p50_ms"],
        "ratio_p99": flooded["p99_ms"] / alone["p99_ms"],
        "b_p50_ms_in_last_quarter": 1000
        * statistics.median(
            latency
            for began, latency in flooded_phase.b_timeline
            if began >= 0.75 * arguments.flood_seconds
        ),
    }
    print(
        f"{name}: B p50 alone {alone['p50_ms']:.0f} ms, with A flooding "
        f"{flooded['p50_ms']:.0f} ms: {summary['ratio_p50']:.2f}x",
        flush=True,
    )
    return summary, phases


async def main(arguments: argparse.Namespace) -> None:
    register_tools([SLOW_TOOL])
    arms: dict[str, dict[str, Any]] = {}
    timelines: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as directory:
        for fairness in (True, False):
            name = f"fairness {'on' if fairness else 'off'}"
            scratch = Path(directory) / name.replace(" ", "_")
            scratch.mkdir()
            arms[name], phases = await measure_arm(scratch, fairness=fairness, arguments=arguments)
            timelines[name] = phases["B with A flooding"].b_timeline
    on, off = arms["fairness on"]["ratio_p50"], arms["fairness off"]["ratio_p50"]
    results = {
        "title": TITLE,
        "machine": machine(),
        "run": run_info(
            n_per_arm=round(arguments.b_rate * arguments.flood_seconds),
            concurrency="open loop",
            rounds="one per arm: fairness on, then off",
            arguments=vars(arguments),
        ),
        "target_ratio": TARGET_RATIO,
        "verdict": "met" if on <= TARGET_RATIO else "missed",
        "starvation_without_fairness": off / on,
        "arms": arms,
    }
    RESULTS.mkdir(exist_ok=True)
    target = RESULTS / f"{TITLE.replace(' ', '_')}.json"
    target.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwritten: {target.relative_to(REPO)}")
    print(
        f"B's p50 with A flooding / alone: {on:.2f}x with fairness (target <= {TARGET_RATIO}x), "
        f"{off:.2f}x without"
    )
    _plot(timelines, arguments.limit)


def _plot(timelines: dict[str, list[tuple[float, float]]], limit: float) -> None:
    plt = pyplot()
    if plt is None:
        return

    figure, axis = plt.subplots(figsize=(7, 3.5))
    for name, points in timelines.items():
        ordered = sorted(points)
        axis.plot([t for t, _ in ordered], [latency * 1000 for _, latency in ordered], label=name)
    axis.set_xlabel("seconds into the flood (task started)")
    axis.set_ylabel("tenant B's task latency (ms)")
    axis.set_yscale("log")
    axis.set_title(f"tenant B while tenant A floods a queue held to {limit:g} activities/s")
    axis.legend()
    figure.tight_layout()
    figure.savefig(RESULTS / f"{TITLE.replace(' ', '_')}.png", dpi=110)
    plt.close(figure)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--b-rate", type=float, default=1.0, help="tenant B's tasks per second")
    parser.add_argument(
        "--flood-factor", type=float, default=10.0, help="tenant A's rate as a multiple of B's"
    )
    parser.add_argument(
        "--limit",
        type=float,
        default=8.0,
        help="the task queue's activities per second (below A's and B's rates together)",
    )
    parser.add_argument(
        "--tool-seconds", type=float, default=0.3, help="how long the tool's far side takes"
    )
    parser.add_argument("--alone-seconds", type=float, default=20.0)
    parser.add_argument("--flood-seconds", type=float, default=40.0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse(sys.argv[1:])))
