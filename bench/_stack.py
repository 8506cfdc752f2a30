"""The processes the one-step benchmarks (``task_overhead``, ``saturation``) run against,
started the same way for both.

On one Temporal dev server and one embedded PostgreSQL (``running_servers``), each in a
process of its own: an ``onceflow worker`` (the production worker, tracing on), ``python
-m bench._bare_worker`` for the bare baseline, ``python -m bench._otlp_sink`` as the
collector every onceflow process exports its spans to, and, when asked for, an
``onceflow gateway`` and ``python -m bench._bare_http`` (the bare endpoint on the
gateway's uvicorn set-up). This process traces as the gateway would (it starts the worker
path's tasks), holds a PostgreSQL pool and one principal allowed ``issue_coupon``, and a
``CpuMeter`` that reads every one of those processes' CPU from ``/proc``.
"""

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from psycopg_pool import AsyncConnectionPool
from temporalio.testing import WorkflowEnvironment

from bench._bare_http import READY as BARE_HTTP_READY
from bench._otlp_sink import READY as SINK_READY
from bench._servers import running_servers
from bench.open_task_calls import CpuMeter
from onceflow.coupons import coupon_tools
from onceflow.gateway import Principal, PrincipalStore
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient, connect_temporal
from onceflow.telemetry import configure_tracing
from onceflow.tools.worker import Catalogue
from tests.harness import REPO, log_line

TOOL = "issue_coupon"
TENANT = "bench"

Process = subprocess.Popen[bytes]


async def start_process(
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
        stop_process(process)
        raise
    return process, line.split(ready, 1)[1].strip()


def stop_process(process: Process) -> None:
    """SIGINT, then SIGKILL after 30 s; a process that already ended is left alone."""
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


@dataclass
class OneStepStack:
    """What a one-step benchmark drives and measures; ``gateway_url`` and ``bare_url`` are
    None when the run was started without the gateway path."""

    temporal: WorkflowEnvironment
    """The dev server; its client is the bare arms' plain client."""
    database_url: str
    queue: str
    """The ``onceflow worker``'s task queue."""
    bare_queue: str
    """The bare worker's task queue."""
    tasks: TaskClient
    """On the client ``connect_temporal`` builds, as production starts tasks."""
    pool: AsyncConnectionPool
    principal: Principal
    api_key: str
    meter: CpuMeter
    processes: dict[str, Process]
    """Every process started here, by the name the meter and the profiles use."""
    sink_log: Path
    """Where the collector prints its span counts when it stops."""
    gateway_url: str | None
    bare_url: str | None


@asynccontextmanager
async def one_step_stack(scratch: Path, *, gateway: bool) -> AsyncIterator[OneStepStack]:
    """Every server and process of a one-step benchmark, logging under ``scratch``; all
    stopped at the end."""
    async with AsyncExitStack() as stack:
        servers = await stack.enter_async_context(running_servers(scratch))
        postgres, temporal = servers.postgres, servers.temporal
        address = temporal.client.service_client.config.target_host
        queue, bare_queue = (f"bench-{uuid.uuid4().hex[:8]}" for _ in range(2))

        processes: dict[str, Process] = {}

        def log_file(name: str) -> Path:
            return scratch / f"{name.split(' (')[0].replace(' ', '_')}.log"

        async def started(
            name: str, arguments: list[str], env: dict[str, str], ready: str
        ) -> tuple[Process, str]:
            process, rest = await start_process(arguments, env, log_file(name), ready)
            stack.callback(stop_process, process)
            processes[name] = process
            return process, rest

        sink_name = "OTLP sink (stand-in collector)"
        _, sink_url = await started(sink_name, ["-m", "bench._otlp_sink"], {}, SINK_READY)
        tracing = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink_url, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
        onceflow_env = {
            **tracing,
            "DATABASE_URL": postgres.url,
            "TEMPORAL_ADDRESS": address,
            "ONCEFLOW_TASK_QUEUE": queue,
            "ONCEFLOW_STATE_DIR": str(scratch / "state"),
            "ONCEFLOW_BUILTIN_TOOLS": TOOL,
        }
        await started(
            "onceflow worker",
            ["-m", "onceflow.cli.main", "worker"],
            onceflow_env,
            "onceflow worker ready",
        )
        await started(
            "bare worker",
            ["-m", "bench._bare_worker", address, bare_queue],
            {},
            "bare worker ready",
        )
        gateway_url = bare_url = None
        if gateway:
            _, ready_line = await started(
                "gateway",
                ["-m", "onceflow.cli.main", "gateway", "--port", "0"],
                onceflow_env,
                "onceflow gateway ready on ",
            )
            gateway_url = ready_line.split()[0]
            _, ready_line = await started(
                "bare endpoint",
                ["-m", "bench._bare_http", address, bare_queue],
                {},
                BARE_HTTP_READY,
            )
            bare_url = ready_line.split()[0]
        meter = CpuMeter(
            {"load generator (this process)": os.getpid()}
            | {name: process.pid for name, process in processes.items()}
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
        yield OneStepStack(
            temporal=temporal,
            queue=queue,
            bare_queue=bare_queue,
            # Policies resolved here travel with each task, as the gateway's do.
            tasks=TaskClient(
                production,
                task_queue=queue,
                catalogue=Catalogue(tuple(tool.contract for tool in coupon_tools())),
            ),
            pool=pool,
            database_url=postgres.url,
            principal=principal,
            api_key=api_key,
            sink_log=log_file(sink_name),
            meter=meter,
            processes=processes,
            gateway_url=gateway_url,
            bare_url=bare_url,
        )
