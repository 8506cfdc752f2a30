"""A worker process SIGKILLed between the provider's commit and the activity's report.

Real ``onceflow worker`` processes, configured only through the environment as in
production; the payment settings they share (attempt timeout, Stripe account) are the
ones the workflow reads, which is why every worker must get the same values.
"""

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from onceflow_devstack.stripe_provider import Fault, ProviderControl, RunningProvider
from temporalio.testing import WorkflowEnvironment

from onceflow.task_api import TaskClient
from onceflow.tools import derive_child_key
from onceflow.workflows.task_models import TaskState
from tests.harness import REPO, eventually, onceflow_command

from .conftest import ACCOUNT, API_KEY, TENANT, VISA_CHARGE, operation_row, start_task

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]

READY = "onceflow worker ready"

WorkerProcess = Callable[[], Awaitable[asyncio.subprocess.Process]]


@pytest.fixture
async def worker_process(
    dev_server: WorkflowEnvironment, database: str, task_queue: str, provider: RunningProvider
) -> AsyncIterator[WorkerProcess]:
    """Starts ready ``onceflow worker`` processes with payments pointed at the provider."""
    environment = {
        **os.environ,
        "TEMPORAL_ADDRESS": dev_server.client.service_client.config.target_host,
        "DATABASE_URL": database,
        "ONCEFLOW_TASK_QUEUE": task_queue,
        "ONCEFLOW_SHUTDOWN_GRACE_SECONDS": "1",
        "STRIPE_API_BASE": provider.base_url,
        "STRIPE_API_KEY": API_KEY,
        "ONCEFLOW_BUILTIN_TOOLS": "charge_payment,refund_payment",
        "ONCEFLOW_STRIPE_ACCOUNT": ACCOUNT,
        "ONCEFLOW_STRIPE_CONNECT_TIMEOUT": "PT0.5S",
        "ONCEFLOW_STRIPE_REQUEST_TIMEOUT": "PT1S",
        # Short, so the server gives up on the killed worker's attempt quickly.
        "ONCEFLOW_PAYMENTS_ATTEMPT_TIMEOUT": "PT4S",
    }
    started: list[tuple[asyncio.subprocess.Process, asyncio.Task[None]]] = []

    async def start() -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(
            *onceflow_command("worker"),
            cwd=REPO,
            env=environment,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        ready = asyncio.Event()
        seen: list[str] = []

        async def read_output() -> None:
            # Keeps draining, so a chatty worker never blocks on a full pipe.
            assert process.stdout is not None
            async for raw in process.stdout:
                seen.append(raw.decode(errors="replace").rstrip())
                if READY in seen[-1]:
                    ready.set()

        reader = asyncio.create_task(read_output())
        started.append((process, reader))
        try:
            await asyncio.wait_for(ready.wait(), timeout=60)
        except TimeoutError:
            raise AssertionError("worker never became ready:\n" + "\n".join(seen)) from None
        return process

    yield start
    for process, reader in started:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), timeout=30)
            except TimeoutError:
                process.kill()
                await process.wait()
        reader.cancel()


async def test_a_worker_killed_after_the_provider_committed_leaves_one_charge(
    worker_process: WorkerProcess,
    tasks: TaskClient,
    control: ProviderControl,
    database: str,
) -> None:
    first = await worker_process()
    # The provider commits, then holds the answer long enough to kill the worker.
    await control.add_fault(
        Fault.DELAY_AFTER_COMMIT, path_prefix="/v1/payment_intents", delay_seconds=30
    )
    workflow_id = await start_task(tasks, ("pay", "charge_payment", VISA_CHARGE))
    await eventually(control.ledger, what="the provider committed the charge", interval=0.02)

    os.kill(first.pid, signal.SIGKILL)
    await first.wait()
    key = derive_child_key(
        tenant=TENANT,
        workflow_id=workflow_id,
        step_id="pay",
        child_op="charge",
        provider_account=ACCOUNT,
    )
    # Killed before it could record anything but its intent to call.
    assert operation_row(database, key)[:2] == ("started", None)

    await worker_process()
    result = await asyncio.wait_for(tasks.result(workflow_id), timeout=40)

    [entry] = await control.ledger()
    assert result.state is TaskState.SUCCEEDED
    assert result.step("pay").resource_id == entry.object_id
    assert "did not report" in (result.step("pay").attempts[0].reason or "")
    posts = [r for r in await control.requests() if r.method == "POST"]
    assert [(r.idempotency_key, r.outcome) for r in posts] == [
        (key, "executed"),
        (key, "replayed"),
    ]
    assert operation_row(database, key)[:3] == ("succeeded", entry.object_id, entry.request_id)
