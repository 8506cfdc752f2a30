"""Waiting on onceflow tasks: poll the status query until a condition holds."""

from collections.abc import Callable

from onceflow.task_api import TaskClient
from onceflow.workflows.task_models import TaskState, TaskStatus

from ._eventually import HANG_SECONDS, eventually


async def wait_for(
    tasks: TaskClient,
    workflow_id: str,
    done: Callable[[TaskStatus], bool],
    *,
    timeout: float = HANG_SECONDS,
) -> TaskStatus:
    """Poll the task's status query until ``done`` holds; fail with the last status."""
    return await eventually(
        lambda: tasks.status(workflow_id),
        until=done,
        what=f"task {workflow_id} reaches the awaited state ({getattr(done, '__name__', done)})",
        timeout=timeout,
    )


def parked(status: TaskStatus) -> bool:
    """The task waits for a reconciliation decision."""
    return status.state is TaskState.PARKED
