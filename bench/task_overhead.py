"""What a one-step onceflow task costs next to a bare Temporal workflow, through the
production path: on the worker, and through the HTTP gateway.

Everything runs on one Temporal dev server and one PostgreSQL, in the same run, each
server in a process of its own, the same way on both sides:

- worker path. Baseline: ``BareWorkflow`` (one no-op activity, ``maximum_attempts=1``)
  started with ``execute_workflow`` on a plain client and run by ``python -m
  bench._bare_worker``. onceflow: a one-step ``issue_coupon`` task (a real INSERT under
  its unique constraint) started with ``TaskClient`` on the client ``connect_temporal``
  builds and awaited, run by an ``onceflow worker`` process, the production worker:
  tracing interceptor, attempt annotations and their log line. The task is the one the
  gateway starts (its policies resolved here and carried in its input, its attributes
  set with the start, an idempotency record whose outcome its starter writes), and
  this process writes the outcome into the record once the task ended, as the gateway
  does. The record is claimed (as the gateway claims it, same scope, fingerprint and
  workflow id) before the clock starts: the claim is the gateway's cost, measured on the
  gateway path.
- gateway path. Baseline: ``python -m bench._bare_http``, a FastAPI endpoint on the
  gateway's uvicorn set-up (``HttpServer``) that starts the bare workflow and waits for
  its result. onceflow: ``POST /v1/tools/issue_coupon/calls`` with a new
  ``Idempotency-Key`` to an ``onceflow gateway`` process (authenticate, validate,
  fingerprint, claim, start, wait for the task to end, answer 200), its task run by the
  same ``onceflow worker``. Both arms send the same body and headers.

Tracing is on wherever production has it: every onceflow process (and this process,
whose ``TaskClient.start`` opens each worker-path task's trace) exports its spans over
OTLP/gRPC (the default protocol) with the default batch processor to
``python -m bench._otlp_sink``, a stand-in collector in its own process that decodes
and counts them. The bare arms have no tracing, as a bare Temporal application has none.

Each round runs, one after the other, ``--tasks / --rounds`` operations of every arm at
``--concurrency``; after each block the run waits out the span exporter's batch delay,
so one arm's exports are not metered as the next arm's CPU. Every process's CPU per
operation is read from ``/proc``, less what the process uses per second while nothing
runs (measured once before the rounds) over the block's time. ``--profile DIR`` samples
both workers and both HTTP servers with py-spy during the measured rounds, prints where
their time goes and writes ``bench/results/task_overhead_profile.json`` instead of the
latency results.

Usage: ``.venv/bin/python -m bench.task_overhead [--tasks 300] [--concurrency 10]
[--rounds 5] [--paths worker,gateway] [--profile DIR]``; a run at another concurrency
writes its results under titles ending ``at concurrency N``.
"""

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
from temporalio.api.enums.v1 import EventType

from bench._one_step import Operation, coupons_and_records, one_step_paths
from bench._report import RESULTS, Arm, report, run_info
from bench._stack import OneStepStack, Process, one_step_stack, stop_process
from bench.open_task_calls import CpuMeter

DEFAULT_CONCURRENCY = 10
TITLES = {
    "worker": "one-step task vs bare workflow",
    "gateway": "one-step task through the gateway vs bare endpoint",
}
TARGETS = {"worker": 1.10, "gateway": 1.10}
"""Issue 43's targets (issue 27's were 1.20 and 1.30): a one-step task at most this many
times its baseline."""
EXPORT_DELAY_SECONDS = 5.0
"""The batch span processor's default schedule (``OTEL_BSP_SCHEDULE_DELAY``, 5 s)."""
IDLE_SECONDS = 10.0
"""How long the run measures what each process uses while nothing runs."""


# ── measuring ───────────────────────────────────────────────────────────────────────


async def _measure(
    arm: Arm,
    count: int,
    concurrency: int,
    operation: Operation,
    meter: CpuMeter,
    settle: float,
    idle: dict[str, float] | None = None,
) -> None:
    """``count`` operations, ``concurrency`` at a time, each timed on its own; the CPU
    every process used meanwhile and until ``settle`` seconds after the last one, less
    what each uses per second when nothing runs (``idle``), over that time."""
    prepared = await operation.prepare(count) if operation.prepare else [None] * count
    gate = asyncio.Semaphore(concurrency)

    async def timed(item: Any) -> None:
        async with gate:
            started = time.perf_counter()
            operation.last_workflow_id = await operation.run(item)
            arm.latencies.append(time.perf_counter() - started)

    cpu = meter.read()
    began = time.perf_counter()
    await asyncio.gather(*(timed(item) for item in prepared))
    arm.wall_seconds += time.perf_counter() - began
    await asyncio.sleep(settle)
    metered = time.perf_counter() - began
    for name, seconds in meter.read().items():
        used = seconds - cpu[name] - (idle or {}).get(name, 0.0) * metered
        arm.cpu_seconds[name] = arm.cpu_seconds.get(name, 0.0) + used


async def _idle_cpu(meter: CpuMeter, seconds: float) -> dict[str, float]:
    """CPU seconds per second each process uses while no operation runs (pollers, the dev
    server's timers, PostgreSQL's background work)."""
    before, began = meter.read(), time.perf_counter()
    await asyncio.sleep(seconds)
    elapsed = time.perf_counter() - began
    return {name: (used - before[name]) / elapsed for name, used in meter.read().items()}


async def _history(client: Any, workflow_id: str) -> dict[str, Any]:
    """What one operation's workflow wrote: events by type, bytes, and the time its
    workflow and activity tasks waited to be dispatched and ran (from event times)."""
    events = (await client.get_workflow_handle(workflow_id).fetch_history()).events
    sequence = [
        EventType.Name(event.event_type).removeprefix("EVENT_TYPE_").lower() for event in events
    ]
    kinds = Counter(sequence)
    at = {event.event_id: event.event_time.ToNanoseconds() / 1e6 for event in events}
    times: Counter[str] = Counter()
    for event in events:
        for kind, attributes, link in (
            ("workflow task wait", "workflow_task_started_event_attributes", "scheduled_event_id"),
            ("workflow task run", "workflow_task_completed_event_attributes", "started_event_id"),
            ("activity task wait", "activity_task_started_event_attributes", "scheduled_event_id"),
            ("activity task run", "activity_task_completed_event_attributes", "started_event_id"),
        ):
            if event.HasField(attributes):
                times[kind] += at[event.event_id] - at[getattr(getattr(event, attributes), link)]
    return {
        "events": len(events),
        "bytes": sum(event.ByteSize() for event in events),
        "start_to_close_ms": at[events[-1].event_id] - at[events[0].event_id],
        "ms": dict(times),
        "events_by_type": dict(sorted(kinds.items())),
        "events_in_order": sequence,
    }


# ── profiling (``--profile DIR``) ───────────────────────────────────────────────────


def _py_spy() -> str:
    found = Path(sys.executable).parent / "py-spy"
    if not found.exists():
        raise SystemExit("--profile needs py-spy: .venv/bin/python -m pip install py-spy")
    return str(found)


SAMPLE_RATE = 100
"""py-spy's samples per second and thread."""


def _sample(pid: int, output: Path) -> Process:
    """py-spy sampling every thread of ``pid`` (Python frames; idle threads left out)."""
    return subprocess.Popen(
        [
            _py_spy(),
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--rate",
            str(SAMPLE_RATE),
            "--output",
            str(output),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


IDLE_FRAMES = (
    "Condition.wait (threading.py",
    "Event.wait (threading.py",
    "EpollSelector.select (selectors.py",
    "_worker (concurrent/futures/thread.py",
)
"""Innermost frames of a thread that waits for work: py-spy counts them when it cannot
tell an idle thread from the OS (as in this container), so they are left out."""

PACKAGES = (
    ("temporalio/worker/workflow_sandbox", "temporalio workflow sandbox"),
    ("temporalio/bridge", "temporalio core bridge and payload visitor"),
    ("temporalio/", "temporalio, other"),
    ("opentelemetry/", "OpenTelemetry SDK and exporter"),
    ("grpc/", "gRPC"),
    ("google/protobuf", "protobuf"),
    ("psycopg", "psycopg and its pool"),
    ("pydantic", "pydantic"),
    ("uvicorn/", "uvicorn, h11"),
    ("h11/", "uvicorn, h11"),
    ("starlette/", "Starlette, FastAPI"),
    ("fastapi/", "Starlette, FastAPI"),
    ("onceflow/", "onceflow"),
    ("asyncio/", "asyncio"),
    ("<frozen importlib", "importlib (module loading)"),
    ("logging/", "logging"),
    ("json/", "json"),
)
"""Where a sample's innermost frame is (own time), first match wins."""

STAGES = (
    ("_Instance.__init__ (temporalio/worker/workflow_sandbox", "sandbox: a new workflow instance"),
    ("<module> (onceflow/workflows/", "  of which: re-running onceflow's workflow module"),
    ("_Instance.activate (temporalio/worker/workflow_sandbox", "workflow activations (sandboxed)"),
    ("PayloadVisitor.visit (temporalio/bridge", "payload visitor (data converter on payloads)"),
    ("_ActivityWorker._execute_activity", "activities"),
    ("perform (onceflow/tools/_activities.py", "  of which: issue_coupon's perform"),
    ("record_task_outcome (onceflow/activities", "  of which: record_task_outcome"),
    ("pin_task_policy (onceflow/tools", "  of which: pin_task_policy (local activity)"),
    ("_AnnotatingActivity._log (onceflow/telemetry", "  of which: the attempt's log line"),
    ("psycopg", "psycopg and its pool, anywhere"),
    ("_check_connection (psycopg_pool", "  of which: the pool's connection check"),
    ("logging/", "logging, anywhere"),
    ("BoundaryService.authenticate", "gateway: authenticate"),
    ("BoundaryService._settle_claim", "gateway: claim loop (claim, start, wait, answer)"),
    ("IdempotencyStore.claim", "  of which: claim"),
    ("IdempotencyStore.mark_started", "  of which: mark_started"),
    ("BoundaryService._store_ended", "  of which: read back the stored outcome"),
    ("TaskClient.start (onceflow/task_api", "  of which: TaskClient.start"),
    ("Client.start_workflow (temporalio/client", "Temporal client: start a workflow"),
    ("WorkflowHandle.result (temporalio/client", "Temporal client: wait for a result"),
    ("uvicorn/protocols", "HTTP server (uvicorn, Starlette, FastAPI, the endpoint)"),
)
"""Stages whose frame is anywhere on a sample's stack (inclusive time)."""


def summarize_profile(raw: Path, *, operations: int, top: int = 15) -> dict[str, Any]:
    """Shares of a process's busy samples (idle waits left out): by the package of the
    innermost frame (own time), by stage (inclusive), and the hottest innermost functions;
    and the busy milliseconds per operation the process served (samples at
    ``SAMPLE_RATE``: an estimate of its CPU per operation, all threads together)."""
    by_package: Counter[str] = Counter()
    by_stage: Counter[str] = Counter()
    by_function: Counter[str] = Counter()
    total = idle = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count, frames = int(count_text), stack.split(";")
        total += count
        if any(frames[-1].startswith(frame) for frame in IDLE_FRAMES):
            idle += count
            continue
        by_function[frames[-1]] += count
        by_package[next((name for part, name in PACKAGES if part in frames[-1]), "other")] += count
        for part, name in STAGES:
            if any(part in frame for frame in frames):
                by_stage[name] += count
    busy = max(total - idle, 1)
    return {
        "samples": total,
        "busy_samples": total - idle,
        "operations": operations,
        "busy_ms_per_operation": (total - idle) * 1000 / SAMPLE_RATE / max(operations, 1),
        "own_time_by_package": [(name, n / busy) for name, n in by_package.most_common()],
        "inclusive_by_stage": [
            (name, by_stage[name] / busy) for _, name in STAGES if by_stage[name]
        ],
        "hottest_functions": [(name, n / busy) for name, n in by_function.most_common(top)],
    }


def _print_profile(name: str, summary: dict[str, Any]) -> None:
    print(
        f"\n-- profile of {name}: {summary['busy_samples']} busy of {summary['samples']} "
        f"samples, {summary['busy_ms_per_operation']:.1f} busy ms per operation --"
    )
    for title in ("own_time_by_package", "inclusive_by_stage", "hottest_functions"):
        print(f"  {title.replace('_', ' ')}:")
        for label, share in summary[title]:
            print(f"    {share:6.1%}  {label}")


def _save_profile(
    profiles: dict[str, Any], tasks: int, concurrency: int, rounds: int, paths: dict[str, Any]
) -> None:
    """``bench/results/task_overhead_profile.json``: where the sampled processes' time went."""
    RESULTS.mkdir(exist_ok=True)
    per_round = max(tasks // rounds, 1)
    file = RESULTS / "task_overhead_profile.json"
    file.write_text(
        json.dumps(
            {
                "title": "where a one-step task's time goes (py-spy)",
                "run": run_info(
                    n_per_arm=per_round * rounds,
                    concurrency=concurrency,
                    rounds=rounds,
                    arguments={"paths": ",".join(paths), "profiled": True},
                ),
                "profiles": profiles,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"  wrote {file}")


# ── the run ─────────────────────────────────────────────────────────────────────────


async def main(
    tasks: int, concurrency: int, rounds: int, paths: Sequence[str], profile: Path | None
) -> None:
    arguments = {
        "tasks": tasks,
        "concurrency": concurrency,
        "rounds": rounds,
        "paths": ",".join(paths),
    }
    loads: list[list[float]] = []
    with tempfile.TemporaryDirectory() as directory:
        measured, outcome = await _run(
            Path(directory), tasks, concurrency, rounds, paths, profile, loads
        )
    if profile is not None:
        print("\n(profiled run: latencies not saved)")
        return
    per_round = max(tasks // rounds, 1)
    for name, (baseline, candidate, round_ratios, histories) in measured.items():
        ratios = report(
            TITLES[name]
            + ("" if concurrency == DEFAULT_CONCURRENCY else f" at concurrency {concurrency}"),
            baseline,
            candidate,
            {
                "path": name,
                "tasks per arm": len(baseline.latencies),
                "concurrency": concurrency,
                "rounds": rounds,
                "target p50 ratio": TARGETS[name],
                **outcome,
            },
            run=run_info(
                n_per_arm=per_round * rounds,
                concurrency=concurrency,
                rounds=rounds,
                arguments=arguments,
            ),
            extra={
                "target_ratio": TARGETS[name],
                "ratios_per_round": round_ratios,
                "history_of_one_operation": histories,
                "load_average_after_each_round": loads,
            },
        )
        verdict = "met" if ratios["p50"] <= TARGETS[name] else "NOT met"
        print(f"  target <= {TARGETS[name]}x at p50: {verdict}")


async def _run(
    scratch: Path,
    tasks: int,
    concurrency: int,
    rounds: int,
    wanted: Sequence[str],
    profile: Path | None,
    loads: list[list[float]],
) -> tuple[dict[str, tuple[Arm, Arm, list[dict[str, float]], dict[str, Any]]], dict[str, Any]]:
    async with AsyncExitStack() as stack:
        servers = await stack.enter_async_context(
            one_step_stack(scratch, gateway="gateway" in wanted)
        )
        meter = servers.meter
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=60, limits=limits))
        paths = one_step_paths(servers, wanted, http)
        print(f"  paths: {list(paths)}; processes: {sorted(meter.processes)}", flush=True)

        for path in paths.values():  # warm-up: imports, connections, caches
            for operation in (path.baseline, path.candidate):
                await _measure(Arm("warm-up"), 20, concurrency, operation, meter, 0.0)
        samplers: list[tuple[str, Process, Path]] = []
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)
            sampled_processes = {
                "onceflow worker": "onceflow worker",
                "bare worker": "bare worker",
                "onceflow gateway": "gateway",
                "bare endpoint": "bare endpoint",
            }
            for sampled, process in sampled_processes.items():
                if process in servers.processes:
                    output = profile / f"{sampled.replace(' ', '_')}.txt"
                    samplers.append(
                        (sampled, _sample(servers.processes[process].pid, output), output)
                    )

        settle = EXPORT_DELAY_SECONDS + 0.5
        await asyncio.sleep(settle)  # the warm-up's spans exported
        idle = await _idle_cpu(meter, IDLE_SECONDS)
        print(
            "  idle CPU (ms/s): " + ", ".join(f"{k} {v * 1000:.1f}" for k, v in idle.items()),
            flush=True,
        )
        per_round = max(tasks // rounds, 1)
        round_ratios: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
        for number in range(1, rounds + 1):
            for name, path in paths.items():
                base, cand = Arm("round"), Arm("round")
                for arm, operation in ((base, path.baseline), (cand, path.candidate)):
                    await _measure(arm, per_round, concurrency, operation, meter, settle, idle)
                    operation.arm.latencies += arm.latencies
                    operation.arm.wall_seconds += arm.wall_seconds
                    for process, seconds in arm.cpu_seconds.items():
                        total = operation.arm.cpu_seconds
                        total[process] = total.get(process, 0.0) + seconds
                round_ratios[name].append(
                    {
                        "p50": cand.percentile(0.5) / base.percentile(0.5),
                        "mean": sum(cand.latencies) / sum(base.latencies),
                    }
                )
            loads.append([round(load, 2) for load in os.getloadavg()])
            print(
                f"  round {number}/{rounds} done (load {loads[-1][0]:.2f}); p50 ratios "
                + ", ".join(f"{name} {r[-1]['p50']:.2f}x" for name, r in round_ratios.items()),
                flush=True,
            )
        profiles = {}
        # Operations each sampled process served while sampled: every worker-path and
        # gateway-path operation of its side; each HTTP server, its path's only.
        served = {
            "onceflow worker": len(paths) * per_round * rounds,
            "bare worker": len(paths) * per_round * rounds,
            "onceflow gateway": per_round * rounds,
            "bare endpoint": per_round * rounds,
        }
        for sampled, sampler, output in samplers:
            sampler.send_signal(signal.SIGINT)
            sampler.wait(timeout=60)
            profiles[sampled] = summarize_profile(output, operations=served[sampled])
            _print_profile(sampled, profiles[sampled])
        if profile is not None:
            _save_profile(profiles, tasks, concurrency, rounds, paths)
        histories = {
            name: {
                operation.arm.name: await _history(
                    servers.temporal.client, operation.last_workflow_id
                )
                for operation in (path.baseline, path.candidate)
                if operation.last_workflow_id is not None
            }
            for name, path in paths.items()
        }
        stop_process(servers.processes["OTLP sink (stand-in collector)"])
        outcome = _outcome(servers, len(paths) * (per_round * rounds + 20))
        outcome["idle CPU per second, subtracted (ms)"] = {
            name: round(rate * 1000, 2) for name, rate in idle.items()
        }
    measured = {
        name: (path.baseline.arm, path.candidate.arm, round_ratios[name], histories[name])
        for name, path in paths.items()
    }
    return measured, outcome


def _outcome(servers: OneStepStack, tasks_run: int) -> dict[str, Any]:
    """The business outcome: each of the ``tasks_run`` onceflow tasks issued one coupon
    and wrote its outcome into its idempotency record; and the spans the collector
    received."""
    coupons, states = coupons_and_records(servers.database_url)
    lines = servers.sink_log.read_text().strip().splitlines()
    spans = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    outcome = {
        "onceflow tasks (incl. warm-up)": tasks_run,
        "coupons issued": coupons,
        "idempotency records by state": states,
        "spans exported": spans.get("spans"),
        "spans per onceflow task": (spans.get("spans") or 0) / tasks_run,
    }
    print(f"  outcome: {outcome}", flush=True)
    print(f"  spans by service and name: {spans.get('spans_by_service_and_name')}", flush=True)
    assert outcome["coupons issued"] == tasks_run, outcome
    assert states.get("processing", 0) == 0, outcome
    return outcome


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300, help="operations per arm")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help="operations in flight per arm; another than the default writes its own files",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--paths", default="worker,gateway", help="worker, gateway or both")
    parser.add_argument(
        "--profile", type=Path, help="py-spy the worker and gateway into this folder; no results"
    )
    parsed = parser.parse_args()
    asyncio.run(
        main(
            parsed.tasks, parsed.concurrency, parsed.rounds, parsed.paths.split(","), parsed.profile
        )
    )
