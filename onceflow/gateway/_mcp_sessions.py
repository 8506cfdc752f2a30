"""The MCP server's sessions and their tasks: each principal acting in a session gets an
open task, opened by its first call and closed when the session ends.

``McpSessions`` (the server run's lifespan context) finds the session of a request (the
``Mcp-Session-Id`` over streamable HTTP, the run itself over stdio) and ends sessions.
A ``_Session`` sends a call to the task its key was sent to before, or to the session's
current task; when that task takes no more calls it moves on to the next one, under a
key derived from the call's own, and keeps the repeat guard across its tasks.
"""

import asyncio
import hashlib
import logging
import secrets
import uuid
from collections import OrderedDict
from collections.abc import Awaitable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from mcp.server.context import ServerRequestContext

from onceflow.errors import CallRefused, InvalidRequest, OnceflowError
from onceflow.gateway._principals import Principal
from onceflow.gateway._requests import BoundaryAnswer
from onceflow.gateway._responses import call_status_code, call_view
from onceflow.gateway._service import BoundaryService
from onceflow.tools import ToolContract
from onceflow.workflows.agent_task import NO_EFFECT_STEP_STATES
from onceflow.workflows.task_models import CallAnswer

log = logging.getLogger("onceflow.gateway")

DELIBERATE_REPEAT_ARGUMENT = "deliberate_repeat"
"""Offered by the tools whose contract allows a deliberate second identical effect."""
SESSION_HEADER = "mcp-session-id"
"""The streamable HTTP session id header (the session the SDK minted, never the client's
invention: an unknown id is answered 404 before any handler runs)."""
_RESENDS = 3
"""Tasks a call is sent to at most (each before refused it, taking no more calls), and
tasks a session tries to open at once."""
_ENDED_SESSIONS_KEPT = 10_000
_T = TypeVar("_T")


class McpSessions:
    """The MCP sessions of one server run (the server's lifespan context) and their tasks.

    A session is created by its first tool call and ended by ``end`` (its connection's
    clean-up, for streamable HTTP) or, with every other, by ``end_all`` when the run ends.
    It also runs the calls whose requests may be cancelled before they end (``finish``,
    ``detach``), so that a broken stream never cancels a call that started.
    """

    def __init__(
        self, service: BoundaryService, *, task_body: dict[str, Any], close_timeout: float
    ) -> None:
        self._service = service
        self._task_body = task_body
        self._close_timeout = close_timeout
        self._run_session = secrets.token_hex(16)
        """The session of a run without HTTP (stdio, a client in process): the run."""
        self._sessions: dict[str, _Session] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._unhooked_warned = False
        self._detached: set[asyncio.Task[Any]] = set()

    def has_session(self, ctx: ServerRequestContext[Any, Any]) -> bool:
        """Whether a request belongs to a session: over streamable HTTP one the SDK
        minted (the handshake era); over stdio (or in process) the run, in any protocol
        revision, since one run serves one client. A 2026-07-28 request over HTTP has
        none: each of its calls is a task of its own."""
        request = ctx.request
        if request is None:
            return True
        headers = getattr(request, "headers", None)
        return bool(headers.get(SESSION_HEADER)) if headers is not None else False

    def detach(self, work: Awaitable[_T]) -> "asyncio.Task[_T]":
        """Run ``work`` on its own: a request that stops waiting for it (the client's
        stream broke: a cancellation in 2026-07-28) does not stop it. The run's end
        waits for it like for the sessions' closing."""
        task = asyncio.ensure_future(work)
        self._detached.add(task)
        task.add_done_callback(_forget)
        task.add_done_callback(self._detached.discard)
        return task

    async def finish(self, work: Awaitable[_T], what: str) -> _T:
        """``work``'s outcome; when the request is cancelled first, ``work`` goes on to
        it (an effect that started is never cancelled by a broken stream)."""
        task = self.detach(work)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                log.info("the client stopped waiting for %s: it goes on to its outcome", what)
            raise

    def session_of(self, ctx: ServerRequestContext[Any, Any]) -> "_Session | None":
        """The session a request belongs to; None for an HTTP request outside one."""
        request = ctx.request
        session_id: str | None = self._run_session
        if request is not None:
            headers = getattr(request, "headers", None)
            session_id = headers.get(SESSION_HEADER) if headers is not None else None
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            session = _Session(self._service, session_id=session_id, task_body=self._task_body)
            if session_id in self._ended:
                # A request that was already in the handler when its session ended.
                session.ended = True
                return session
            self._sessions[session_id] = session
            if request is not None:
                self._end_with_connection(ctx, session_id)
        return session

    async def end(self, session_id: str) -> None:
        """End a session: close its tasks, waiting at most ``close_timeout``; never raises."""
        self._ended[session_id] = None
        while len(self._ended) > _ENDED_SESSIONS_KEPT:
            self._ended.popitem(last=False)
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        try:
            await asyncio.wait_for(session.end(), self._close_timeout)
        except TimeoutError:
            log.warning(
                "MCP session %s ended, but its tasks did not close within %g s; they close "
                "themselves after their idle timeout",
                session.name,
                self._close_timeout,
            )
        except Exception:
            log.exception("MCP session %s ended, but closing its tasks failed", session.name)

    async def end_all(self) -> None:
        """End every session still open (the run is ending), and give the calls whose
        clients stopped waiting the same bounded time to end."""
        await asyncio.gather(*(self.end(session_id) for session_id in list(self._sessions)))
        if self._detached:
            await asyncio.wait(set(self._detached), timeout=self._close_timeout)

    def _end_with_connection(self, ctx: ServerRequestContext[Any, Any], session_id: str) -> None:
        # The SDK unwinds a connection's exit stack (shielded, bounded) however its session
        # ends: DELETE, idle timeout, crash or shutdown. mcp 2.3 documents the stack as the
        # place for per-connection clean-up but hands lowlevel handlers no public way to
        # it yet (its Context rework adds ``ctx.connection``), hence the private read.
        connection: Any = getattr(ctx.session, "_connection", None)
        stack = getattr(connection, "exit_stack", None)
        if isinstance(stack, AsyncExitStack) and connection.session_id == session_id:
            stack.push_async_callback(self.end, session_id)
            return
        if not self._unhooked_warned:
            self._unhooked_warned = True
            log.warning(
                "cannot hook the end of MCP sessions: their tasks close when the server "
                "stops, or after their idle timeout"
            )


@dataclass
class _PrincipalTasks:
    """The tasks one principal opened in a session: the current one, and all of them."""

    principal: Principal
    current: str | None = None
    generation: int = 0
    opened: list[str] = field(default_factory=list)


class _Session:
    """One MCP session: an open task per principal acting in it."""

    def __init__(
        self, service: BoundaryService, *, session_id: str, task_body: dict[str, Any]
    ) -> None:
        self._service = service
        self._task_body = task_body
        # Stable for the session, and all that is kept or logged of it: a session id
        # lets whoever holds it act in the session.
        self.name = "mcp-" + hashlib.sha256(session_id.encode()).hexdigest()[:32]
        self.ended = False
        self._lock = asyncio.Lock()
        self._tasks: dict[uuid.UUID, _PrincipalTasks] = {}

    async def call(
        self,
        principal: Principal,
        contract: ToolContract,
        arguments: dict[str, Any],
        idempotency_key: str | None,
        deliberate_repeat: Any,
    ) -> BoundaryAnswer:
        """Send one tool call to the task its key belongs to, or to the session's task
        (opened by the session's first call)."""
        # What the boundary checks before it reserves anything, checked before the
        # session's task is opened for this call: a refused call opens nothing.
        key, digest = self._service.check_call(contract, arguments, idempotency_key)
        if not isinstance(deliberate_repeat, bool):
            raise InvalidRequest(
                f"{DELIBERATE_REPEAT_ARGUMENT} must be true or false",
                errors=[{"loc": [DELIBERATE_REPEAT_ARGUMENT], "msg": "Input should be a bool"}],
            )
        body: dict[str, Any] = {"tool": contract.name, "arguments": arguments}
        if deliberate_repeat:
            body["deliberate_repeat"] = True
        refusal: CallRefused | None = None
        for _ in range(_RESENDS):
            earlier = await self._task_of_key(principal, key)
            if earlier is None and not deliberate_repeat:
                repeat = await self._earlier_tasks_call(principal, contract.name, digest)
                if repeat is not None:
                    return repeat
            task_id = earlier if earlier is not None else await self._current_task(principal)
            try:
                return await self._service.call_in_task(principal, task_id, body, key)
            except CallRefused as refused:
                if not await self._takes_no_more_calls(principal, task_id):
                    raise
                refusal = refused
            # The task refused the call before recording anything, and takes no more:
            # the session goes on in its next task, where the call goes under a key of
            # its own (the refusing task keeps this key's refusal). Derived from the key
            # and the refusing task, it is found again by a retry of the same key.
            await self._move_on_from(principal, task_id)
            key = _key_after_refusal(task_id, key)
        assert refusal is not None
        raise refusal

    async def _earlier_tasks_call(
        self, principal: Principal, tool: str, digest: str
    ) -> BoundaryAnswer | None:
        """The repeat guard across the session's tasks: a new call identical to one an
        earlier task of this session took (and that did not end without an effect) is
        answered by that call, as it is now, marked ``repeat_of``; each task's own guard
        covers its own calls. Read from the earlier tasks' status, so a call they still
        run, park or await approval for answers with its current state."""
        async with self._lock:
            tasks = self._tasks.get(principal.principal_id)
            earlier = [t for t in tasks.opened if t != tasks.current] if tasks else []
        for task_id in earlier:
            status = await self._service.task_status(principal, task_id)
            for step in status.steps:
                if (
                    step.tool == tool
                    and step.arguments_digest == digest
                    and not step.repeat_of
                    and step.state not in NO_EFFECT_STEP_STATES
                ):
                    view = call_view(
                        CallAnswer(
                            task_id=task_id,
                            task_state=status.state,
                            call=step.model_copy(update={"attempts": []}),
                            repeat_of=step.step_id,
                        )
                    )
                    return BoundaryAnswer(
                        status_code=call_status_code(view),
                        body=view.model_dump(mode="json"),
                        task_id=task_id,
                        replayed=False,
                    )
        return None

    async def end(self) -> None:
        """Close every task the session opened (closing is idempotent)."""
        self.ended = True
        async with self._lock:
            opened = [(tasks.principal, t) for tasks in self._tasks.values() for t in tasks.opened]
        await asyncio.gather(*(self._close(principal, task) for principal, task in opened))

    async def _current_task(self, principal: Principal) -> str:
        async with self._lock:
            if self.ended:
                raise CallRefused(
                    "the MCP session has ended: its task takes no more calls",
                    reason="the MCP session has ended",
                )
            tasks = self._tasks.setdefault(principal.principal_id, _PrincipalTasks(principal))
            if tasks.current is not None:
                return tasks.current
            for _ in range(_RESENDS):
                tasks.generation += 1
                answer = await self._service.open_task(
                    principal, self._task_body, f"{self.name}.{tasks.generation}"
                )
                # Not created: the generation's key names a task that has ended already.
                if answer.created:
                    tasks.current = answer.task_id
                    tasks.opened.append(answer.task_id)
                    log.info(
                        "MCP session %s of %s/%s: task %s",
                        self.name,
                        principal.tenant,
                        principal.name,
                        answer.task_id,
                    )
                    return answer.task_id
            raise CallRefused(
                "the MCP session could not open a task that takes calls",
                reason="every task opened for this session had ended",
            )

    async def _move_on_from(self, principal: Principal, task_id: str) -> None:
        async with self._lock:
            tasks = self._tasks.get(principal.principal_id)
            if tasks is not None and tasks.current == task_id:
                tasks.current = None

    async def _takes_no_more_calls(self, principal: Principal, task_id: str) -> bool:
        """Whether the task refuses every new call because of its age or its end, not
        because of this call (or its spent budget, which a next task must not reset)."""
        try:
            status = await self._service.task_status(principal, task_id)
        except OnceflowError:
            return False
        if status.closing is not None or status.state.is_terminal:
            return True
        return datetime.now(UTC) >= status.budget.deadline_at

    async def _task_of_key(self, principal: Principal, key: str) -> str | None:
        """The task this principal sent a call with this key to, if any (from any session:
        a retry after a reconnect is the same call, not a new one in the new session)."""
        return await self._service.task_of_call_key(principal, key)

    async def _close(self, principal: Principal, task_id: str) -> None:
        try:
            status = await self._service.close_task(principal, task_id)
        except Exception as error:
            log.warning(
                "MCP session %s ended, but its task %s was not closed (%s); it closes "
                "itself after its idle timeout",
                self.name,
                task_id,
                type(error).__name__,
            )
            return
        log.info("MCP session %s ended: task %s is %s", self.name, task_id, status.state.value)


def _forget(task: "asyncio.Task[Any]") -> None:
    # Its outcome went to whoever still waited, or nowhere (logged by the boundary).
    if not task.cancelled():
        task.exception()


def _key_after_refusal(task_id: str, idempotency_key: str) -> str:
    """The key a call refused by ``task_id`` is sent under to the session's next task."""
    digest = hashlib.sha256(f"v1\x00{task_id}\x00{idempotency_key}".encode()).hexdigest()
    return f"mcp-{digest[:40]}"
