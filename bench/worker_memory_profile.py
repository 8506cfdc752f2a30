"""Where a waiting task's memory goes: the breakdown behind the worker-memory benchmark.

The same two workers and the same tasks as ``bench/worker_memory.py`` (a bare worker
holding ``BareWaitingWorkflow``s; ``onceflow worker`` holding ``start_deployment`` tasks
that await approval), each in its own process, filled with ``--warm`` workflows and then
``--tasks`` more. The worker process is this module run with ``--serve``: on SIGUSR1 it
reads its own memory, and the growth between the two readings, divided by ``--tasks``,
is what one more waiting workflow holds. Three passes per arm, each a fresh worker:

- plain: resident set size (``VmRSS``) and the bytes malloc has handed out (glibc
  ``mallinfo2``: every native allocation, the SDK core's and the protobuf arenas among
  them, and Python's objects over 512 bytes; smaller ones live in Python's own arenas);
- traced: the Python heap the new workflows hold, by owner (``tracemalloc``, started at
  the first reading so the warm-up runs untraced);
- tracked, when ``heaptrack`` is installed: the native allocations made between the
  readings and still live at the second, by owner (heaptrack attached to the worker after
  the first reading).

Results: ``bench/results/worker_memory_profile.json``.

Usage: ``.venv/bin/python -m bench.worker_memory_profile [--warm 100] [--tasks 300]``
"""

import argparse
import asyncio
import collections
import ctypes
import functools
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import tracemalloc
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

from bench._report import RESULTS, machine, run_info

FRAMES = 40
"""Frames kept per traced allocation: enough to reach the workflow code that made it."""
DEBUG = {"TEMPORAL_DEBUG": "1"}
"""Set for the traced pass only: tracing 40 frames slows the bare worker's import of its
workflow module for each run past the SDK's 2 s deadlock limit, which fails the workflow
task again and again; debug mode lifts the limit (and changes nothing a run holds)."""


def python_owner(stack: list[str]) -> str:
    """Who made a Python allocation, from the files of its traceback (oldest first)."""
    if any("importlib" in file or "bench/_bare.py" in file for file in stack):
        return "the workflow module, imported again for each run"
    if any("onceflow/workflows/" in file and "runner.py" not in file for file in stack):
        return "the task's own state (onceflow's workflow code)"
    if any(part in stack[-1] for part in ("pydantic", "json/")):
        return "decoded inputs and activity results"
    sdk = next((file for file in reversed(stack) if "temporalio" in file), "")
    if "workflow_sandbox" in sdk:
        return "the sandbox's per-run objects"
    if "opentelemetry" in stack[-1] or "opentelemetry" in sdk:
        return "the tracing interceptor's per-run objects"
    return "the SDK's workflow instance" if sdk else "other"


NATIVE_OWNERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("protobuf messages the SDK keeps (upb arenas)", ("upb_",)),
    ("core: the run's command queues", ("CommandAndMachine",)),
    ("core: the run's history update", ("HistoryPaginator", "history_update")),
    ("core: the run's metrics context", ("MetricsContext",)),
    ("core: the run's state machines", ("instantiate_or_update",)),
    ("core: copies of memo and search attributes", ("hashbrown",)),
    ("core: other", ("temporalio_sdk_core", "temporalio_common", "prost", "tokio")),
    ("Python objects over 512 bytes", ("_PyObject_", "PyType_", "PyMem_")),
)
"""Who made each native allocation, first match wins: a part of a function name on its
stack (heaptrack's own stack format, innermost last)."""


# ── the worker side (``--serve``) ──────────────────────────────────────────────────


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _malloc_in_use() -> int:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return int(info.uordblks + info.hblkhd)


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def serve(arm: str, out: Path, trace: bool, arguments: list[str]) -> None:
    """Run the arm's worker in this process; each SIGUSR1 writes a reading to ``out``."""
    readings = 0

    def read(signum: int, frame: FrameType | None) -> None:
        nonlocal readings
        gc.collect()
        if trace and not tracemalloc.is_tracing():
            tracemalloc.start(FRAMES)
        reading = {"rss_kib": _rss_kib(), "malloc_bytes": _malloc_in_use()}
        if trace:
            tracemalloc.take_snapshot().dump(str(out / f"snapshot{readings}"))
        (out / f"reading{readings}.json").write_text(json.dumps(reading))
        readings += 1

    signal.signal(signal.SIGUSR1, read)
    if arm == "bare":
        from bench._bare_worker import serve as serve_bare

        asyncio.run(serve_bare(*arguments))
    else:
        from onceflow.cli.main import app

        sys.argv = ["onceflow", "worker"]
        app()


# ── the driver ─────────────────────────────────────────────────────────────────────


async def profile_arm(
    arm: str,
    warm: int,
    tasks: int,
    *,
    trace: bool,
    track: bool,
    scratch: Path,
) -> dict[str, Any]:
    """One pass: a fresh worker, filled and read twice; its per-task figures (the tasks
    carry their policies, as every task since 0.3.0 does); ``trace``: with the Python heap
    by owner; ``track``: with the native heap by owner."""
    from bench._bare import BareWaitingWorkflow
    from bench._servers import embedded_servers
    from bench.worker_memory import (
        REPO,
        _processed,
        deployment_task,
        onceflow_worker_env,
        steady_rss_kib,
    )
    from onceflow.task_api import TaskClient
    from onceflow.tools.worker import Catalogue, register_tools
    from tests.harness import eventually, log_line
    from tests.tool_configuration import builtin_tool

    out = Path(tempfile.mkdtemp(dir=scratch))
    heaptrack = shutil.which("heaptrack") if track else None
    async with embedded_servers(out) as (database_url, server):
        client = server.client
        address = client.service_client.config.target_host
        queue = f"profile-{uuid.uuid4().hex[:8]}"
        command = [sys.executable, "-m", "bench.worker_memory_profile", "--serve", arm]
        command += ["--out", str(out), *(["--trace"] if trace else [])]
        start: Callable[[int], Awaitable[object]]
        if arm == "bare":
            command += ["--", address, queue]
            env = {}
            ready = "bare worker ready"

            def start(n: int) -> Awaitable[object]:
                return client.start_workflow(
                    BareWaitingWorkflow.run, "x", id=f"{queue}-{n}", task_queue=queue
                )
        else:
            env = onceflow_worker_env(database_url, address, queue, out)
            ready = "onceflow worker ready"
            catalogue = Catalogue()
            register_tools([builtin_tool("start_deployment")], catalogue)
            task_client = TaskClient(client, task_queue=queue, catalogue=catalogue)

            def start(n: int) -> Awaitable[object]:
                return task_client.start(deployment_task(n), workflow_id=f"{queue}-{n}")

        # Traced, a bare worker takes seconds per new run: fewer at a time, so that none
        # waits past the minute ``_processed`` allows.
        gate = asyncio.Semaphore(5 if trace else 20)

        async def open_one(n: int) -> None:
            async with gate:
                await start(n)
                await _processed(client, f"{queue}-{n}")

        log = out / "worker.log"
        with log.open("wb") as written:
            worker = subprocess.Popen(
                command,
                cwd=REPO,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **env, **(DEBUG if trace else {})},
                stdout=written,
                stderr=subprocess.STDOUT,
            )
        tracker = None
        try:
            await log_line(worker, log, ready, timeout=90)

            async def reading(number: int) -> dict[str, int]:
                await steady_rss_kib(worker.pid)
                worker.send_signal(signal.SIGUSR1)
                path = out / f"reading{number}.json"
                await eventually(path.exists, what=f"reading {number}", timeout=120)
                value: dict[str, int] = json.loads(path.read_text())
                return value

            await asyncio.gather(*(open_one(n) for n in range(warm)))
            before = await reading(0)
            if heaptrack is not None:
                said = out / "heaptrack.log"
                with said.open("wb") as heaptrack_log:
                    tracker = subprocess.Popen(
                        [heaptrack, "-p", str(worker.pid)],
                        cwd=out,
                        stdout=heaptrack_log,
                        stderr=subprocess.STDOUT,
                    )
                await log_line(tracker, said, "injection finished", timeout=120)
            await asyncio.gather(*(open_one(n) for n in range(warm, warm + tasks)))
            after = await reading(1)
        finally:
            if tracker is not None:
                worker.kill()  # heaptrack keeps what was live at the end
                tracker.wait(timeout=300)
            else:
                worker.terminate()
            worker.wait(timeout=60)
    result: dict[str, Any] = {
        "rss_kib_per_task": (after["rss_kib"] - before["rss_kib"]) / tasks,
        "malloc_kib_per_task": (after["malloc_bytes"] - before["malloc_bytes"]) / tasks / 1024,
    }
    if trace:
        result["python_heap"] = _python_owners(out / "snapshot1", tasks)
    if heaptrack is not None:
        result["native_heap"] = _native_owners(next(out.glob("heaptrack.*.zst")), tasks)
    return result


def _python_owners(snapshot: Path, tasks: int) -> dict[str, float]:
    """KiB per task of the Python heap the run made and still holds, by owner."""
    owners: collections.Counter[str] = collections.Counter()
    for trace in tracemalloc.Snapshot.load(str(snapshot)).traces:
        owners[python_owner([frame.filename for frame in trace.traceback])] += trace.size
    return _per_task(owners, tasks)


def _native_owners(recording: Path, tasks: int) -> dict[str, float]:
    """KiB per task of native allocations made after heaptrack attached and still live."""
    stacks = recording.with_suffix(".stacks")
    subprocess.run(
        [
            "heaptrack_print",
            "--file",
            str(recording),
            "--flamegraph-cost-type",
            "leaked",
            "--print-flamegraph",
            str(stacks),
        ],
        check=True,
        capture_output=True,
    )
    owners: collections.Counter[str] = collections.Counter()
    for line in stacks.read_text().splitlines():
        stack, _, cost = line.rpartition(" ")
        owner = next((name for name, parts in NATIVE_OWNERS if any(p in stack for p in parts)), "")
        owners[owner or "other"] += int(cost)
    return _per_task(owners, tasks)


def _per_task(owners: collections.Counter[str], tasks: int) -> dict[str, float]:
    by_owner = {name: size / tasks / 1024 for name, size in owners.most_common()}
    return {"total": sum(by_owner.values()), **by_owner}


async def main(warm: int, tasks: int) -> None:
    arms = ("bare", "onceflow")
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as directory:
        scratch = Path(directory)
        for arm in arms:
            name = f"{arm} worker"
            plain, traced, tracked = (
                functools.partial(profile_arm, arm, warm, tasks, scratch=scratch, **passes)
                for passes in (
                    {"trace": False, "track": False},
                    {"trace": True, "track": False},
                    {"trace": False, "track": True},
                )
            )
            results[name] = await plain()
            results[name]["python_heap"] = (await traced())["python_heap"]
            if shutil.which("heaptrack"):
                results[name]["native_heap"] = (await tracked())["native_heap"]
            print(f"{name}: {json.dumps(results[name], indent=2)}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "worker_memory_profile.json").write_text(
        json.dumps(
            {
                "title": "what one more waiting workflow holds in a worker",
                "machine": machine(),
                "run": run_info(
                    n_per_arm=tasks,
                    concurrency=20,
                    rounds=None,
                    arguments={"warm": warm, "tasks": tasks},
                ),
                "notes": {
                    "warm": warm,
                    "tasks": tasks,
                    "heaptrack": bool(shutil.which("heaptrack")),
                },
                **results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=100)
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--serve", choices=("bare", "onceflow"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("worker_arguments", nargs="*", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.serve:
        serve(arguments.serve, arguments.out, arguments.trace, arguments.worker_arguments)
    else:
        asyncio.run(main(arguments.warm, arguments.tasks))
