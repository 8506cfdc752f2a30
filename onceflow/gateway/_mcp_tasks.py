"""The MCP tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663) backed by the
Temporal task: a durable handle for a call that waits, built on the SDK's extension hooks.

Offered to a 2026-07-28 request outside any session (streamable HTTP) whose client
declared the extension on the request. Such a ``tools/call`` runs as always (a one-step
task, ``BoundaryService.call_tool``); when it has not ended within ``wait_seconds`` (a
person must approve it, it is parked, or it simply runs long), the call goes on without
the request and the client gets a task (``CreateTaskResult``) instead, only once the
call's task answers in Temporal and its handle is in PostgreSQL. So a ``tasks/get`` for
it always resolves. The handle's id is unguessable and its principal's only.

``tasks/get`` reads the call from its task's status now::

    step pending / running / backing off ─▶ working
    step awaiting approval / parked ──────▶ working, statusMessage: a person decides
    step succeeded / failed / denied ─────▶ completed, result: the call's tool result
                                            (isError when it had no effect)
    step denied by the agent's withdrawal ▶ cancelled
    task ended without the call's outcome ▶ failed, error: why (e.g. terminated)

``tasks/cancel`` is cooperative (``TaskHandles.cancel``): a call not sent yet (awaiting
approval) is withdrawn, recorded in the task as a denial by its agent; one that may have
taken effect is never undone, and its status message says so. ``tasks/update`` is
acknowledged (onceflow asks clients for no input). A principal's handle is unknown to
every other one (``-32602``, as for an id that never existed).
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from onceflow.errors import OnceflowError, TaskNotFound
from onceflow.gateway._principals import Principal
from onceflow.gateway._requests import BoundaryAnswer
from onceflow.gateway._service import TOOL_CALL_STEP_ID, BoundaryService
from onceflow.gateway._task_handles import CancelOutcome, TaskHandle
from onceflow.idempotency import stored_outcome
from onceflow.workflows.agent_task import NO_EFFECT_STEP_STATES
from onceflow.workflows.task_models import StepState, StepStatus, TaskStatus

if TYPE_CHECKING:
    from onceflow.gateway._mcp_sessions import McpSessions

log = logging.getLogger("onceflow.gateway")

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
TASK_WAIT_SECONDS = 2.0
"""How long a call of a client that declared the tasks extension may take before it is
answered with a task instead of its result."""
POLL_INTERVAL_MS = 1_000
"""The polling interval suggested while a call runs."""
PERSON_POLL_INTERVAL_MS = 5_000
"""The polling interval suggested while a person decides (that takes minutes, not ms)."""
TASK_META = "onceflow/task_id"
STEP_META = "onceflow/step_id"
_STARTED_POLL = 0.05
_ENDED = frozenset({StepState.SUCCEEDED, *NO_EFFECT_STEP_STATES})
_MODERN = frozenset(MODERN_PROTOCOL_VERSIONS)

PrincipalOf = Callable[[ServerRequestContext[Any, Any]], Awaitable[Principal]]
AnswerOf = Callable[[BoundaryAnswer], types.CallToolResult]


class TaskRequestParams(types.RequestParams):
    """``tasks/get`` and ``tasks/cancel``: the task's id."""

    task_id: str = Field(min_length=1, max_length=200)


class UpdateTaskRequestParams(TaskRequestParams):
    """``tasks/update``: responses to input requests (onceflow never makes any)."""

    input_responses: dict[str, Any] = Field(default_factory=dict)


class DurableTasks(Extension):
    """The tasks extension of ``onceflow mcp``: handles of waiting calls, read from their
    Temporal task. Applied by ``apply_extension``."""

    identifier = TASKS_EXTENSION

    def __init__(
        self,
        service: BoundaryService,
        principal_of: PrincipalOf,
        answer_of: AnswerOf,
        *,
        wait_seconds: float = TASK_WAIT_SECONDS,
    ) -> None:
        self._service = service
        self._principal_of = principal_of
        self._answer_of = answer_of
        self._wait_seconds = wait_seconds

    def methods(self) -> Sequence[MethodBinding]:
        return (
            MethodBinding("tasks/get", TaskRequestParams, self._get, _MODERN),
            MethodBinding("tasks/cancel", TaskRequestParams, self._cancel, _MODERN),
            MethodBinding("tasks/update", UpdateTaskRequestParams, self._update, _MODERN),
        )

    async def intercept_tool_call(
        self,
        params: types.CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        sessions: McpSessions = ctx.lifespan_context
        key = (params.arguments or {}).get("idempotency_key")
        if (
            params.name not in self._service.catalogue
            or not isinstance(key, str)
            or sessions.has_session(ctx)
            or not _declared(ctx)
        ):
            return await call_next(ctx)
        try:
            principal = await self._principal_of(ctx)
        except OnceflowError:
            return await call_next(ctx)  # refused there, as without the extension
        call: asyncio.Task[HandlerResult] = sessions.detach(call_next(ctx))
        await asyncio.wait({call}, timeout=self._wait_seconds)
        if call.done():
            return call.result()
        # Still waiting: a task once the call's task is there to read (the spec's
        # "durably created"); a call refused or ended meanwhile answers as itself.
        workflow_id = self._service.call_workflow_id(principal, params.name, key)
        status: TaskStatus | None = None
        while status is None and not call.done():
            try:
                status = await self._service.task_status(principal, workflow_id)
            except TaskNotFound:
                await asyncio.wait({call}, timeout=_STARTED_POLL)
            except OnceflowError:
                await asyncio.wait({call})
        if call.done() or status is None:
            return await call
        handle = await self._service.task_handles.hand_out(
            principal, workflow_id=workflow_id, step_id=TOOL_CALL_STEP_ID, tool=params.name
        )
        log.info("MCP call %s of task %s goes on as MCP task", params.name, workflow_id)
        created = self._task(handle, status)
        created.pop("result", None)  # a CreateTaskResult carries no outcome
        created.pop("error", None)
        return {"resultType": "task", **created}

    async def _get(
        self, ctx: ServerRequestContext[Any, Any], params: TaskRequestParams
    ) -> dict[str, Any]:
        require_client_extension(ctx, TASKS_EXTENSION)
        async with _protocol_errors():
            principal = await self._principal_of(ctx)
            handle, status = await self._service.task_handles.read(principal, params.task_id)
        return self._task(handle, status)

    async def _cancel(
        self, ctx: ServerRequestContext[Any, Any], params: TaskRequestParams
    ) -> dict[str, Any]:
        require_client_extension(ctx, TASKS_EXTENSION)
        async with _protocol_errors():
            principal = await self._principal_of(ctx)
            outcome = await self._service.task_handles.cancel(principal, params.task_id)
        return {"_meta": {"onceflow/cancel": outcome.value, "onceflow/message": _CANCEL[outcome]}}

    async def _update(
        self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskRequestParams
    ) -> dict[str, Any]:
        require_client_extension(ctx, TASKS_EXTENSION)
        async with _protocol_errors():
            principal = await self._principal_of(ctx)
            await self._service.task_handles.read(principal, params.task_id)
        return {}  # nothing is ever asked of the client: acknowledged, ignored

    def _task(self, handle: TaskHandle, status: TaskStatus) -> dict[str, Any]:
        """The task as ``tasks/get`` shows it (a ``DetailedTask``)."""
        step = status.step(handle.step_id)
        task: dict[str, Any] = {
            "taskId": handle.task_id,
            "createdAt": _iso(handle.created_at),
            "lastUpdatedAt": _iso(_last_update(handle, status, step)),
            "ttlMs": int((handle.expires_at - handle.created_at).total_seconds() * 1000),
            "pollIntervalMs": POLL_INTERVAL_MS,
            # Where a person finds the call (onceflow status / approve / reconcile).
            "_meta": {TASK_META: status.workflow_id, STEP_META: handle.step_id},
        }
        if step.state in _ENDED and status.state.is_terminal:
            if step.state is StepState.DENIED and handle.cancel_outcome is CancelOutcome.WITHDRAWN:
                return {
                    **task,
                    "status": "cancelled",
                    "statusMessage": f"{step.tool} was cancelled before it was sent: it never ran.",
                }
            _, status_code, body, _ = stored_outcome(status)
            answer = BoundaryAnswer(
                status_code=status_code, body=body, task_id=status.workflow_id, replayed=False
            )
            result = self._answer_of(answer)
            return {
                **task,
                "status": "completed",
                "statusMessage": f"{step.tool} {step.state.value}.",
                "result": result.model_dump(by_alias=True, mode="json", exclude_none=True),
            }
        if status.state.is_terminal:
            reason = status.failure_reason or "the task ended without the call's outcome"
            return {
                **task,
                "status": "failed",
                "statusMessage": reason,
                "error": {"code": types.INTERNAL_ERROR, "message": reason},
            }
        message = _working_message(step)
        if step.state in (StepState.AWAITING_APPROVAL, StepState.PARKED):
            task["pollIntervalMs"] = PERSON_POLL_INTERVAL_MS
        if handle.cancel_outcome is CancelOutcome.NOT_UNDONE:
            message += " " + _CANCEL[CancelOutcome.NOT_UNDONE]
        return {**task, "status": "working", "statusMessage": message}


def apply_extension(server: Any, extension: Extension, call_tool: Any) -> None:
    """Apply an extension to a lowlevel ``Server`` as ``MCPServer(extensions=[...])`` does:
    its methods (gated to their protocol versions), its capability, and its ``tools/call``
    interceptor around ``call_tool``."""
    from mcp.server.extension import compose_tool_call_handler

    for method in extension.methods():
        server.add_request_handler(method.method, method.params_type, _gated(method))
    server.extensions[extension.identifier] = extension.settings()
    server.add_request_handler(
        "tools/call", types.CallToolRequestParams, compose_tool_call_handler([extension], call_tool)
    )


def _gated(method: MethodBinding) -> Any:
    versions = method.protocol_versions

    async def gated(ctx: ServerRequestContext[Any, Any], params: Any) -> HandlerResult:
        if versions is not None and ctx.protocol_version not in versions:
            raise MCPError(code=types.METHOD_NOT_FOUND, message="Method not found")
        return await method.handler(ctx, params)

    return gated


def _declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether the request's client declared the extension (per request, 2026-07-28)."""
    capabilities = getattr(ctx.session, "client_capabilities", None)
    extensions = getattr(capabilities, "extensions", None) or {}
    return ctx.protocol_version in _MODERN and TASKS_EXTENSION in extensions


@asynccontextmanager
async def _protocol_errors() -> AsyncIterator[None]:
    """Refusals as JSON-RPC errors: an unknown (or another principal's) task is invalid
    params, as the extension says; a backend that does not answer an internal error."""
    try:
        yield
    except TaskNotFound:
        raise MCPError(
            code=types.INVALID_PARAMS, message="Failed to retrieve task: Task not found"
        ) from None
    except OnceflowError as refused:
        code = types.INTERNAL_ERROR if refused.status >= 500 else types.INVALID_REQUEST
        raise MCPError(code=code, message=refused.detail) from None


_CANCEL = {
    CancelOutcome.WITHDRAWN: (
        "The call had not been sent (it awaited approval): it is withdrawn and will never "
        "run; the task records the withdrawal."
    ),
    CancelOutcome.NOT_UNDONE: (
        "Cancellation was asked for, but the call may already have taken effect, so it "
        "was not undone: it goes on to its outcome."
    ),
    CancelOutcome.ALREADY_ENDED: "The call had already ended: nothing was cancelled.",
}


def _working_message(step: StepStatus) -> str:
    match step.state:
        case StepState.AWAITING_APPROVAL:
            return (
                f"{step.tool} awaits a person's approval: a person decides whether it may "
                "run. Do not call it again; keep polling this task."
            )
        case StepState.PARKED:
            return (
                f"{step.tool} is parked: whether it took effect is uncertain "
                f"({step.park_reason or 'no reason was given'}), and a person decides. "
                "Do not call it again; keep polling this task."
            )
        case StepState.BACKING_OFF if step.waiting_for_provider:
            return (
                f"{step.tool} is waiting for its provider ({step.waiting_for_provider}); it "
                "goes on by itself. Do not call it again; keep polling this task."
            )
        case StepState.BACKING_OFF:
            return f"{step.tool} is waiting to try again (attempt {len(step.attempts)} failed)."
    return f"{step.tool} is running."


def _last_update(handle: TaskHandle, status: TaskStatus, step: StepStatus) -> datetime:
    times = [handle.created_at]
    times += [attempt.finished_at for attempt in step.attempts]
    times += [d.at for d in status.decisions if d.step_id == step.step_id]
    return max(times)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
