"""Task handles: a durable, unguessable name for one call that is still waiting, handed to
a client that asked for one (the MCP tasks extension), read and cancelled only by the
principal it was handed to.

A handle names a call's task and step; the call's state stays where it always is, in the
task's workflow (Temporal). PostgreSQL keeps the handle's id, whose it is, until when,
and what a cancellation did with it (``mcp_task_handles``, migration 15)::

    hand_out ──▶ live ──read (call not ended)──▶ live, expires_at pushed on
                  │
                  ├── cancel, call awaiting approval ─▶ withdrawn (the task records a
                  │                                     denial by the agent; nothing ran)
                  ├── cancel, call may have effect ───▶ not_undone (it goes on)
                  └── cancel, call ended ─────────────▶ already_ended

A handle of another principal, or one past ``expires_at``, is reported exactly like an
unknown one.
"""

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from onceflow.errors import DecisionConflict, TaskNotFound
from onceflow.gateway._backend import backend_errors
from onceflow.gateway._principals import Principal
from onceflow.gateway._task_directory import TaskDirectory
from onceflow.storage import autocommit
from onceflow.task_api import TaskClient
from onceflow.workflows.agent_task import NO_EFFECT_STEP_STATES
from onceflow.workflows.task_models import ApproveInput, StepState, TaskStatus

HANDLE_PREFIX = "oft_"
WITHDRAWN_REASON = "withdrawn by the agent that made the call (MCP tasks/cancel) before it was sent"
"""The reason recorded in the task for a call its own agent withdrew while it awaited
approval: a denial, never an approval."""
_ENDED_STEP_STATES = frozenset({StepState.SUCCEEDED, *NO_EFFECT_STEP_STATES})


class CancelOutcome(StrEnum):
    """What a cancellation did with the call behind a handle."""

    WITHDRAWN = "withdrawn"
    """The call awaited approval, so nothing was sent: it will never run."""
    NOT_UNDONE = "not_undone"
    """The call runs, backs off or is parked: it may have taken effect, so it goes on."""
    ALREADY_ENDED = "already_ended"
    """The call had ended already."""


@dataclass(frozen=True)
class TaskHandle:
    """One handle: the call it names and what became of a cancellation."""

    task_id: str
    tenant: str
    workflow_id: str
    step_id: str
    tool: str
    created_at: datetime
    expires_at: datetime
    cancel_outcome: CancelOutcome | None


class TaskHandleStore:
    """The ``mcp_task_handles`` table."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self._pool = pool

    async def hand_out(
        self,
        principal: Principal,
        *,
        workflow_id: str,
        step_id: str,
        tool: str,
        ttl: timedelta,
    ) -> TaskHandle:
        """The principal's handle of the call, made now unless it has one already."""
        params = {
            "task_id": HANDLE_PREFIX + secrets.token_urlsafe(32),
            "tenant": principal.tenant,
            "principal_id": principal.principal_id,
            "workflow_id": workflow_id,
            "step_id": step_id,
            "tool": tool,
            "ttl": ttl,
        }
        async with self._pool.connection() as conn, autocommit(conn):
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(_PRUNE)
            await cursor.execute(_HAND_OUT, params)
            row = await cursor.fetchone()
            if row is None:
                # Handed out before: ON CONFLICT returns nothing, read it in a statement
                # of its own (one that sees the row another transaction committed).
                await cursor.execute(_OF_CALL, params)
                row = await cursor.fetchone()
        if row is None:  # pragma: no cover - only if it was pruned in between
            raise TaskNotFound("no such task")
        return _handle(row)

    async def get(self, principal: Principal, task_id: str) -> TaskHandle:
        """The principal's live handle; ``TaskNotFound`` for any other id."""
        if not task_id.startswith(HANDLE_PREFIX) or len(task_id) > 100:
            raise TaskNotFound("no such task")
        async with self._pool.connection() as conn, autocommit(conn):
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(
                _GET,
                {
                    "task_id": task_id,
                    "tenant": principal.tenant,
                    "principal_id": principal.principal_id,
                },
            )
            row = await cursor.fetchone()
        if row is None:
            raise TaskNotFound("no such task")
        return _handle(row)

    async def keep(self, task_id: str, ttl: timedelta) -> datetime:
        """Push the handle's expiry on to ``ttl`` from now (its call has not ended)."""
        async with self._pool.connection() as conn, autocommit(conn):
            cursor = await conn.execute(_KEEP, {"task_id": task_id, "ttl": ttl})
            row = await cursor.fetchone()
        if row is None:
            raise TaskNotFound("no such task")
        expires_at: datetime = row[0]
        return expires_at

    async def record_cancel(self, task_id: str, outcome: CancelOutcome) -> CancelOutcome:
        """Record a cancellation; a withdrawal, once recorded, stays the outcome."""
        async with self._pool.connection() as conn, autocommit(conn):
            cursor = await conn.execute(_CANCEL, {"task_id": task_id, "outcome": outcome.value})
            row = await cursor.fetchone()
        return CancelOutcome(row[0]) if row is not None else outcome


class TaskHandles:
    """Hands out, reads and cancels handles, as their principal."""

    def __init__(
        self,
        *,
        store: TaskHandleStore,
        directory: TaskDirectory,
        tasks: TaskClient,
        ttl: timedelta,
    ) -> None:
        self._store = store
        self._directory = directory
        self._tasks = tasks
        self.ttl = ttl
        """How long a handle lives past its last read while its call has not ended (the
        records' result retention)."""

    async def hand_out(
        self, principal: Principal, *, workflow_id: str, step_id: str, tool: str
    ) -> TaskHandle:
        """A handle of the principal's call, once its task exists (the caller checked)."""
        async with backend_errors():
            return await self._store.hand_out(
                principal, workflow_id=workflow_id, step_id=step_id, tool=tool, ttl=self.ttl
            )

    async def read(self, principal: Principal, task_id: str) -> tuple[TaskHandle, TaskStatus]:
        """The handle and its task's status now, for its own principal only."""
        async with backend_errors():
            handle = await self._store.get(principal, task_id)
        status = await self._directory.task_status(principal, handle.workflow_id)
        if status.principal != principal.name:
            raise TaskNotFound("no such task")
        step = _step(status, handle)
        if step.state not in _ENDED_STEP_STATES:
            async with backend_errors():
                expires_at = await self._store.keep(task_id, self.ttl)
            handle = _replace(handle, expires_at=expires_at)
        return handle, status

    async def cancel(self, principal: Principal, task_id: str) -> CancelOutcome:
        """Cancel cooperatively: withdraw a call not sent yet (awaiting approval), leave
        one that may have taken effect to go on; recorded either way."""
        handle, status = await self.read(principal, task_id)
        step = _step(status, handle)
        if step.state is StepState.AWAITING_APPROVAL:
            denial = ApproveInput(
                step_id=step.step_id,
                approved=False,
                approver=principal.name,
                reason=WITHDRAWN_REASON,
                arguments_digest=step.arguments_digest,
            )
            try:
                async with backend_errors():
                    await self._tasks.approve(handle.workflow_id, denial)
                outcome = CancelOutcome.WITHDRAWN
            except DecisionConflict:
                # A person decided first: the call goes their way.
                _, status = await self.read(principal, task_id)
                step = _step(status, handle)
                outcome = (
                    CancelOutcome.ALREADY_ENDED
                    if step.state in _ENDED_STEP_STATES
                    else CancelOutcome.NOT_UNDONE
                )
        elif step.state in _ENDED_STEP_STATES:
            outcome = CancelOutcome.ALREADY_ENDED
        else:
            outcome = CancelOutcome.NOT_UNDONE
        async with backend_errors():
            return await self._store.record_cancel(task_id, outcome)


def _step(status: TaskStatus, handle: TaskHandle) -> Any:
    try:
        return status.step(handle.step_id)
    except KeyError:
        raise TaskNotFound("no such task") from None


def _replace(handle: TaskHandle, *, expires_at: datetime) -> TaskHandle:
    return TaskHandle(**{**handle.__dict__, "expires_at": expires_at})


def _handle(row: dict[str, Any]) -> TaskHandle:
    outcome = row["cancel_outcome"]
    return TaskHandle(
        task_id=row["task_id"],
        tenant=row["tenant"],
        workflow_id=row["workflow_id"],
        step_id=row["step_id"],
        tool=row["tool"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        cancel_outcome=CancelOutcome(outcome) if outcome is not None else None,
    )


_COLUMNS = "task_id, tenant, workflow_id, step_id, tool, created_at, expires_at, cancel_outcome"
_PRUNE = """
DELETE FROM mcp_task_handles WHERE task_id IN (
    SELECT task_id FROM mcp_task_handles WHERE expires_at < now() LIMIT 100
)
"""
_HAND_OUT = f"""
INSERT INTO mcp_task_handles
    (task_id, tenant, principal_id, workflow_id, step_id, tool, expires_at)
VALUES
    (%(task_id)s, %(tenant)s, %(principal_id)s, %(workflow_id)s, %(step_id)s, %(tool)s,
     now() + %(ttl)s)
ON CONFLICT (principal_id, workflow_id, step_id) DO NOTHING
RETURNING {_COLUMNS}
"""
_OF_CALL = f"""
SELECT {_COLUMNS} FROM mcp_task_handles
WHERE principal_id = %(principal_id)s AND workflow_id = %(workflow_id)s
  AND step_id = %(step_id)s
"""
_GET = f"""
SELECT {_COLUMNS} FROM mcp_task_handles
WHERE task_id = %(task_id)s AND tenant = %(tenant)s AND principal_id = %(principal_id)s
  AND expires_at > now()
"""
_KEEP = """
UPDATE mcp_task_handles SET expires_at = greatest(expires_at, now() + %(ttl)s)
WHERE task_id = %(task_id)s
RETURNING expires_at
"""
_CANCEL = """
UPDATE mcp_task_handles
SET cancel_requested_at = coalesce(cancel_requested_at, now()),
    cancel_outcome = CASE WHEN cancel_outcome = 'withdrawn' THEN cancel_outcome
                          ELSE %(outcome)s END
WHERE task_id = %(task_id)s
RETURNING cancel_outcome
"""
