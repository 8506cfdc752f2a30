"""Starts tasks and sends decisions through Temporal's client API.

The CLI and the boundary use this; it never decides whether a request is a repeat (that
is the boundary's fingerprint check), it only starts idempotently by workflow id.
"""

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from opentelemetry import trace
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from onceflow.telemetry import current_trace_id
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.agent_task import TRACE_ID_MEMO
from onceflow.workflows.task_models import (
    AgentTaskInput,
    ApproveInput,
    DecisionResult,
    ReconcileInput,
    TaskState,
    TaskStatus,
)
from onceflow.workflows.visibility import TASK_STATE, TASK_TENANT


class DecisionRefused(Exception):
    """The task refused an approve or reconcile decision; nothing was recorded."""


@dataclass(frozen=True)
class TaskSummary:
    """One line of a task listing, from Temporal's visibility store."""

    workflow_id: str
    state: str
    tenant: str
    started_at: datetime


class TaskClient:
    """onceflow's operations on tasks, over one Temporal client."""

    def __init__(self, client: Client, *, task_queue: str) -> None:
        self._client = client
        self._task_queue = task_queue

    async def start(
        self, task: AgentTaskInput, *, workflow_id: str, memo: Mapping[str, Any] | None = None
    ) -> WorkflowHandle[AgentTaskWorkflow, TaskStatus]:
        """Start the task, or attach to the task that already has this workflow id.

        A running task is joined (``USE_EXISTING``) and a closed one is never run again
        (``REJECT_DUPLICATE``): the same id always means the same task and its result.
        ``memo`` is stored only when this call starts the task (the boundary keeps the
        request fingerprint there, to tell a joined task's request from its own).

        The start runs in a ``StartTask`` span (a child of the caller's span, e.g. the
        gateway request's), so every task has one trace; its id goes into the memo as
        ``trace_id`` for an operator who finds the task in the Temporal UI.
        """
        tools = ", ".join(step.tool for step in task.steps)
        # The tracer is looked up per start: the process installs its provider after import.
        with trace.get_tracer("onceflow.tasks").start_as_current_span(
            "StartTask",
            attributes={
                "onceflow.workflow_id": workflow_id,
                "onceflow.tenant": task.tenant,
                "onceflow.principal": task.principal,
                "onceflow.tools": [step.tool for step in task.steps],
            },
        ):
            trace_id = current_trace_id()
            if trace_id is not None:
                memo = {**(memo or {}), TRACE_ID_MEMO: trace_id}
            try:
                return await self._client.start_workflow(
                    AgentTaskWorkflow.run,
                    task,
                    id=workflow_id,
                    task_queue=self._task_queue,
                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                    id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                    static_summary=f"{task.tenant}: {tools}",
                    static_details=(
                        f"Agent task of tenant `{task.tenant}` for principal "
                        f"`{task.principal}`, {len(task.steps)} step(s): {tools}."
                        + (f"\n\nTrace: `{trace_id}`" if trace_id else "")
                    ),
                    memo=memo,
                )
            except WorkflowAlreadyStartedError:
                return self._client.get_workflow_handle_for(AgentTaskWorkflow.run, workflow_id)

    async def status(self, workflow_id: str) -> TaskStatus:
        """The task's current status (works for running and closed tasks)."""
        handle = self._client.get_workflow_handle_for(AgentTaskWorkflow.run, workflow_id)
        return await handle.query(AgentTaskWorkflow.status)

    async def result(self, workflow_id: str) -> TaskStatus:
        """Wait for the task to end and return its final status."""
        handle = self._client.get_workflow_handle_for(AgentTaskWorkflow.run, workflow_id)
        return await handle.result()

    async def approve(self, workflow_id: str, decision: ApproveInput) -> DecisionResult:
        """Send an approval; raises ``DecisionRefused`` with the task's reason."""
        handle = self._client.get_workflow_handle_for(AgentTaskWorkflow.run, workflow_id)
        try:
            return await handle.execute_update(AgentTaskWorkflow.approve, decision)
        except WorkflowUpdateFailedError as failed:
            raise DecisionRefused(_refusal(failed)) from None

    async def reconcile(self, workflow_id: str, decision: ReconcileInput) -> DecisionResult:
        """Send a reconciliation decision; raises ``DecisionRefused`` with the reason."""
        handle = self._client.get_workflow_handle_for(AgentTaskWorkflow.run, workflow_id)
        try:
            return await handle.execute_update(AgentTaskWorkflow.reconcile, decision)
        except WorkflowUpdateFailedError as failed:
            raise DecisionRefused(_refusal(failed)) from None

    async def list(
        self, *, state: TaskState | None = None, tenant: str | None = None, limit: int = 100
    ) -> AsyncIterator[TaskSummary]:
        """Tasks from the visibility store, newest first, optionally filtered."""
        clauses = ["WorkflowType = 'AgentTaskWorkflow'"]
        if state is not None:
            clauses.append(f"{TASK_STATE.name} = '{state.value}'")
        if tenant is not None:
            clauses.append(f"{TASK_TENANT.name} = '{_quoted(tenant)}'")
        async for execution in self._client.list_workflows(" AND ".join(clauses), limit=limit):
            attributes = execution.typed_search_attributes
            yield TaskSummary(
                workflow_id=execution.id,
                state=attributes.get(TASK_STATE) or "unknown",
                tenant=attributes.get(TASK_TENANT) or "",
                started_at=execution.start_time,
            )


def _refusal(failed: WorkflowUpdateFailedError) -> str:
    cause = failed.cause
    message = getattr(cause, "message", None) or str(cause or failed)
    return str(message)


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")
