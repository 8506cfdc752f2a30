"""Waiting on tasks from tests: poll the status query until a condition holds."""

import asyncio
from collections.abc import Callable

from onceflow.task_api import TaskClient
from onceflow.workflows.task_models import TaskState, TaskStatus


async def wait_for(
    tasks: TaskClient,
    workflow_id: str,
    done: Callable[[TaskStatus], bool],
    *,
    timeout: float = 20.0,
) -> TaskStatus:
    """Poll the task's status query until ``done`` holds; fail with the last status."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        status = await tasks.status(workflow_id)
        if done(status):
            return status
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition never held; last status: {status.model_dump_json()}")
        await asyncio.sleep(0.05)


def parked(status: TaskStatus) -> bool:
    """The task waits for a reconciliation decision."""
    return status.state is TaskState.PARKED
