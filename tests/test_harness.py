"""The shared harness can fail: each wait and each quiescence probe refuses what it must.

A probe that always passed would turn every negative check built on it into a test that
cannot fail, so each one is shown here both ways, on the real dev server.
"""

import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.harness import eventually, log_line, settled_count, workflow_idle


@workflow.defn(sandboxed=False)
class WaitsForASignal:
    """Idle once started: nothing of its own pending until someone signals it."""

    def __init__(self) -> None:
        self._go = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self._go)

    @workflow.signal
    def go(self) -> None:
        self._go = True


@workflow.defn(sandboxed=False)
class WakesUpLater:
    """Looks quiet but is not: a timer will wake it in an hour."""

    @workflow.run
    async def run(self) -> None:
        await workflow.sleep(timedelta(hours=1))  # scenario: the timer the probe must see


@pytest.fixture
async def worker(dev_server: WorkflowEnvironment, task_queue: str) -> AsyncIterator[Client]:
    async with Worker(
        dev_server.client,
        task_queue=task_queue,
        workflows=[WaitsForASignal, WakesUpLater],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        yield dev_server.client


async def test_eventually_returns_what_arrived_and_names_what_never_did() -> None:
    reads = iter([0, 0, 3])
    assert await eventually(lambda: next(reads), what="a third read", interval=0) == 3

    with pytest.raises(AssertionError, match=r"within 0.1 s: the flag is set; last read: False"):
        await eventually(lambda: False, what="the flag is set", timeout=0.1)


async def test_log_line_waits_for_readiness_and_fails_at_once_when_the_process_exits(
    tmp_path: Path,
) -> None:
    log = tmp_path / "out.log"
    script = "import sys; print('booting'); print('ready on http://x'); sys.stdout.flush()"
    with log.open("wb") as out:
        ready = subprocess.Popen([sys.executable, "-c", script], stdout=out)
    assert await log_line(ready, log, "ready on ") == "ready on http://x"
    ready.wait()

    with log.open("wb") as out:
        dying = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], stdout=out)
    dying.wait()
    with pytest.raises(AssertionError, match=r"exited \(3\)"):
        await log_line(dying, log, "ready on ", timeout=30)


async def test_workflow_idle_vouches_for_a_waiting_workflow_and_refuses_a_pending_timer(
    worker: Client, task_queue: str
) -> None:
    waiting = await worker.start_workflow(
        WaitsForASignal.run, id=f"idle-{uuid.uuid4().hex}", task_queue=task_queue
    )
    await workflow_idle(worker, waiting.id)
    await waiting.signal(WaitsForASignal.go)
    await waiting.result()
    await workflow_idle(worker, waiting.id)

    sleeping = await worker.start_workflow(
        WakesUpLater.run, id=f"timer-{uuid.uuid4().hex}", task_queue=task_queue
    )
    with pytest.raises(AssertionError, match=r"has nothing pending .* \['timer "):
        await workflow_idle(worker, sleeping.id, timeout=1)
    await sleeping.terminate("test over")


async def test_settled_count_counts_what_was_started_before_it(
    dev_server: WorkflowEnvironment, task_queue: str
) -> None:
    client = dev_server.client
    started = [
        await client.start_workflow(
            "NoWorkerRunsThis", id=f"c-{n}-{task_queue}", task_queue=task_queue
        )
        for n in range(3)
    ]
    try:
        assert await settled_count(client, f"TaskQueue = '{task_queue}'") == 3
    finally:
        for handle in started:
            await handle.terminate("test over")
