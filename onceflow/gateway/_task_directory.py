"""The boundary's directory of tasks: a task's status as its tenant may see it, why a task
did not answer, and which tasks are open.

Calls and decisions ask it before they reserve anything (only a task of the caller's
tenant can be called or decided, only an open one takes calls); ``GET /v1/tasks/{id}``
and the MCP tools read a task's status through it. Another tenant's task is reported
exactly like a missing one. A task's tenant and kind (open or a plan) are fixed for its
life and its id is never reused, so each process remembers them for the tasks it saw
lately and asks Temporal only once.
"""

import asyncio
from collections import OrderedDict

from temporalio.client import WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode

from onceflow.errors import TaskNotFound, TaskNotOpen, TaskUnanswered
from onceflow.gateway._backend import STATUS_QUERY_TIMEOUT, TEMPORAL_UNREACHABLE, backend_errors
from onceflow.gateway._principals import Principal
from onceflow.task_api import TaskClient
from onceflow.workflows.task_models import TaskStatus

_TASK_KINDS_KEPT = 10_000
"""Tasks whose tenant and kind one boundary process remembers (see ``_task_kinds``)."""


class TaskDirectory:
    """Finds tasks for their tenant: status, why one did not answer, which are open."""

    def __init__(self, tasks: TaskClient) -> None:
        self._tasks = tasks
        self._task_kinds: OrderedDict[str, tuple[str, bool]] = OrderedDict()
        """Tenant and open-ness of tasks seen lately, by task id: both are fixed for the
        task's life, and a task id is never reused, so they need asking only once."""

    async def task_status(self, principal: Principal, task_id: str) -> TaskStatus:
        """A task of the principal's tenant; ``TaskNotFound`` for any other."""
        if len(task_id) > 1000:
            raise TaskNotFound("no such task")
        async with backend_errors():
            try:
                status = await asyncio.wait_for(self._tasks.status(task_id), STATUS_QUERY_TIMEOUT)
            except TimeoutError:
                raise await self.unanswered(task_id, tenant=principal.tenant) from None
            except RPCError as error:
                if error.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
                    raise TaskNotFound("no such task") from None
                if error.status in TEMPORAL_UNREACHABLE:
                    raise
                # E.g. FAILED_PRECONDITION while its workflow task fails: Temporal holds
                # the task, no worker can answer for it now.
                raise await self.unanswered(
                    task_id, tenant=principal.tenant, failure=f"{error.status.name}: {error}"
                ) from None
            except WorkflowQueryFailedError as failed:
                raise await self.unanswered(
                    task_id, tenant=principal.tenant, failure=str(failed)
                ) from None
        # Another tenant's task is reported exactly like a missing one.
        if status.tenant != principal.tenant:
            raise TaskNotFound("no such task")
        return status

    async def unanswered(
        self, task_id: str, *, tenant: str | None = None, failure: str | None = None
    ) -> TaskNotFound | TaskUnanswered:
        """Why a task did not answer, from what Temporal holds without a worker: no such
        task (404, or another tenant's), its workflow task failing, no worker polling its
        queue, or a worker too slow to answer in time."""
        summary = await self._tasks.summary(task_id)
        if summary is None or (tenant is not None and summary.tenant != tenant):
            return TaskNotFound("no such task")
        exists = f"task {task_id} exists ({summary.state}) but"
        if summary.workflow_task_attempts > 1:
            return TaskUnanswered(
                f"{exists} its workflow task fails (attempt {summary.workflow_task_attempts}, "
                "retried by Temporal), so no worker answers for it: see the failure in the "
                "task's history in the Temporal UI (a worker without one of its tools, or a "
                "release whose change to the workflow shipped without its patch)"
                + (f"; the status query said: {failure}" if failure else "")
            )
        if failure is not None:
            return TaskUnanswered(
                f"{exists} its status query failed: {failure} (its workflow task fails: "
                "see the task in the Temporal UI)"
            )
        if await self._tasks.workers_polling() == 0:
            return TaskUnanswered(
                f"{exists} no worker polls its task queue: start one (onceflow worker)",
                retry_after_seconds=5,
            )
        return TaskUnanswered(
            f"{exists} did not answer its status query within {STATUS_QUERY_TIMEOUT:g} s, "
            "although workers polled its task queue lately (one may have just stopped, "
            "or be too busy)"
        )

    def knows(self, task_id: str) -> bool:
        """Whether this process remembers the task's tenant and kind."""
        return task_id in self._task_kinds

    def remember_task(self, task_id: str, *, tenant: str, is_open: bool) -> None:
        """Remember a task's tenant and kind (both fixed for its life)."""
        self._task_kinds[task_id] = (tenant, is_open)
        self._task_kinds.move_to_end(task_id)
        while len(self._task_kinds) > _TASK_KINDS_KEPT:
            self._task_kinds.popitem(last=False)

    def check_open_task(self, principal: Principal, task_id: str) -> None:
        """Refuse a remembered task that is another tenant's or a plan."""
        tenant, is_open = self._task_kinds[task_id]
        if tenant != principal.tenant:
            # Another tenant's task is reported exactly like a missing one.
            raise TaskNotFound("no such task")
        if not is_open:
            raise TaskNotOpen(
                "this task is a plan: its steps were given when it started; "
                "create an open task (POST /v1/tasks with open) to send calls",
                task_id=task_id,
            )
