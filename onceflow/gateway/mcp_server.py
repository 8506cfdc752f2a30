"""The boundary over MCP: each catalogue tool, with its effect contract as annotations, and
one MCP session as one open task.

A session's first tool call opens an open task for the calling principal (a session that
only lists tools opens nothing); every tool call of the session is a call of that task
(``BoundaryService.call_in_task``), keyed by the call's ``idempotency_key`` argument. So
the task's one retry budget and its repeat guard span the session: the model calling the
same tool with the same arguments again, under a new key, is answered by the earlier call
(``repeat_of``) and nothing runs again. The session's end closes its task:

* streamable HTTP: the session is the ``Mcp-Session-Id`` the SDK minted; it ends when the
  client deletes it, when it idles out, or when the server shuts down;
* stdio (and a client in process): one server run is one session, ended when its input
  closes;
* a request that belongs to no session (the 2026-07-28 protocol's single exchange over
  HTTP) has no task to join: it runs as a one-step task of its own, as
  ``POST /v1/tools/{tool}/calls`` does, identified by its ``idempotency_key``.

Each era is told only what the server keeps in it: ``initialize`` and a session's
``server/discover`` answer ``SESSION_INSTRUCTIONS``, a sessionless ``server/discover``
``STATELESS_INSTRUCTIONS``, and ``tools/list`` offers ``deliberate_repeat`` only in a
session. A call goes on when its request is cancelled (in 2026-07-28 a broken response
stream is the cancellation, and the client re-issues the call under a new request id):
its outcome reaches the key's record, and the re-issued call gets it. A sessionless call
of a client that declared the tasks extension can be answered with a durable task
handle (``_mcp_tasks``).

Closing is bounded (``close_timeout``) and never raises: a task that could not be closed
closes itself after its idle timeout. A session outlives its task's limits: when its task
takes no more calls (its idle timeout, lifetime or deadline passed, or someone closed it),
the session opens its next task and sends the refused call there, under a key derived
from the call's own key and the refusing task (the refusing task recorded nothing). The
repeat guard spans the session across that rollover: a new call identical to one an
earlier task of the session took is answered by that call (read from the earlier task's
status, so as it is now), never run in the new task; the new task's budget is its own.

A retry with the same key is the same call wherever it arrives: a key the principal used
before goes to the task it was sent to, even from another session. Boundary refusals come
back as tool results with ``isError`` and the problem document, so the model can read why;
an unknown tool is a protocol error.

Over stdio the principal is fixed by ``ONCEFLOW_API_KEY``, authenticated at start-up.
Over streamable HTTP every request authenticates with its own ``Authorization: Bearer``
header, ``initialize`` and ``tools/list`` included: the server's ``streamable_http_app``
answers a request without a valid key ``401`` (``WWW-Authenticate: Bearer
realm="onceflow"``, a problem document) before the MCP SDK reads it, so nobody who merely
reaches the port learns the tools (several principals sharing one session each get a
task of their own). ``tools/list`` shows the tools the principal may call, and the
read-only task status tool.

The sessions and their tasks are kept by ``_mcp_sessions``; this module holds the tools,
the handlers, the HTTP gate and the results a model reads.
"""

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from onceflow.errors import (
    BackendUnavailable,
    InvalidRequest,
    OnceflowError,
    UnknownToolRequested,
)
from onceflow.gateway._mcp_sessions import DELIBERATE_REPEAT_ARGUMENT, SESSION_HEADER, McpSessions
from onceflow.gateway._mcp_tasks import (
    TASK_WAIT_SECONDS,
    TASKS_EXTENSION,
    DurableTasks,
    apply_extension,
)
from onceflow.gateway._principals import Principal
from onceflow.gateway._requests import BoundaryAnswer
from onceflow.gateway._responses import CallView
from onceflow.gateway._service import BoundaryService
from onceflow.tools import ToolContract
from onceflow.tools.worker import IDEMPOTENCY_KEY_MAX_LENGTH, IDEMPOTENCY_KEY_PATTERN
from onceflow.workflows.task_models import StepState, TaskState

__all__ = [
    "DELIBERATE_REPEAT_ARGUMENT",
    "IDEMPOTENCY_KEY_ARGUMENT",
    "PROBLEM_JSON",
    "REPLAYED_META",
    "SESSION_CLOSE_TIMEOUT",
    "SESSION_HEADER",
    "SESSION_INSTRUCTIONS",
    "STATELESS_INSTRUCTIONS",
    "TASKS_EXTENSION",
    "TASK_STATUS_TOOL",
    "WWW_AUTHENTICATE",
    "BearerGate",
    "BoundaryMcpServer",
    "McpSessions",
    "PrincipalResolver",
    "bearer_principal",
    "build_mcp_server",
    "fixed_principal",
    "tool_definition",
]

IDEMPOTENCY_KEY_ARGUMENT = "idempotency_key"
TASK_STATUS_TOOL = "onceflow_task_status"
"""A read-only tool to poll a task whose call returned before it ended."""
REPLAYED_META = "onceflow/replayed"
SESSION_CLOSE_TIMEOUT = 3.0
"""Seconds a session's end waits for its tasks to close. Below the MCP SDK's own bound on
a connection's clean-up (5 s), and the stdio client's grace before it kills the server
(2 s) is what a closing usually takes far less than."""
_PRINCIPAL_STATE = "onceflow.principal"
"""Where the HTTP gate leaves the principal it authenticated, in the request's state."""
PROBLEM_JSON = "application/problem+json"
WWW_AUTHENTICATE = 'Bearer realm="onceflow"'

SESSION_INSTRUCTIONS = (
    "This MCP session is one onceflow task: one retry budget for all its tool "
    "calls. Tools with effects take an idempotency_key: reuse it when you retry a "
    "call, use a new one for a new call. A call with the same tool and arguments "
    "as an earlier call of the session is answered by that call (repeat_of) and "
    "does not run again. A call that is parked or awaiting approval waits for a "
    "person: do not repeat it; poll it with "
    f"{TASK_STATUS_TOOL} or call again with the same idempotency_key."
)
"""What a client with a session is told: a handshake-era session over HTTP, or any
client of a stdio server (one run serves one client)."""
STATELESS_INSTRUCTIONS = (
    "Each tool call is its own onceflow task, identified by its idempotency_key: this "
    "server keeps no session between calls. Tools with effects take an idempotency_key: "
    "send the same key with the same arguments to get the same outcome, however often "
    "you retry and even after a lost connection (a broken stream never cancels a call "
    "that started); use a new key for a new call. The same business intent asked again "
    "under a new key (the same order's charge, a tool's same identifying arguments) is "
    "answered by its first call (result.repeat_of) and makes no second effect; while that "
    "call's effect is in doubt it is refused, naming it. Set deliberate_repeat only to "
    "make a second identical effect on purpose. A call that is parked or awaiting "
    f"approval waits for a person: call again with the same idempotency_key, poll "
    f"{TASK_STATUS_TOOL}, or poll the task it returned (clients of the "
    "io.modelcontextprotocol/tasks extension)."
)
"""What a 2026-07-28 client over streamable HTTP is told: no session; each call its own
task, under the intent rule every surface shares."""

PrincipalResolver = Callable[[ServerRequestContext[Any, Any]], Awaitable[Principal]]


def tool_definition(contract: ToolContract, *, in_session: bool = True) -> types.Tool:
    """The MCP tool of a contract: its arguments plus ``idempotency_key`` (and, in a
    session, ``deliberate_repeat`` when the contract allows one), and annotations.

    ``in_session``: whether the caller's requests belong to a session (``McpSessions
    .has_session``), whose repeat guard ``deliberate_repeat`` steps past; outside one
    (2026-07-28 over HTTP) each call is its own task and the argument would mean nothing.
    """
    schema = contract.input_model.model_json_schema()
    properties = dict(schema.get("properties", {}))
    properties[IDEMPOTENCY_KEY_ARGUMENT] = {
        "type": "string",
        "minLength": 1,
        "maxLength": IDEMPOTENCY_KEY_MAX_LENGTH,
        "pattern": f"^{IDEMPOTENCY_KEY_PATTERN}$",
        "description": (
            "Identifies this logical call: send the same key when retrying it, a new key "
            "for a new call. The same key with other arguments is refused."
            + (
                ""
                if in_session
                else " Each call is a task of its own: the key is what makes a retry (even "
                "after a lost connection) the same call, answered with its first outcome."
            )
        ),
    }
    if contract.deliberate_repeats:
        properties[DELIBERATE_REPEAT_ARGUMENT] = {
            "type": "boolean",
            "default": False,
            "description": (
                "Set only to make a second effect identical to an earlier call on purpose "
                "(e.g. a second, identical order). Without it, a call of the same intent "
                "as an earlier one (this session's, or any call's with the same identifying "
                "arguments, under any key) is answered by that call and does not run again."
            ),
        }
    schema["properties"] = properties
    schema["required"] = [*schema.get("required", []), IDEMPOTENCY_KEY_ARGUMENT]
    schema.pop("title", None)
    return types.Tool(
        name=contract.name,
        description=contract.description,
        input_schema=schema,
        annotations=types.ToolAnnotations(
            title=contract.mcp_annotations()["title"],
            read_only_hint=contract.effects.read_only,
            destructive_hint=contract.effects.destructive,
            idempotent_hint=contract.effects.idempotent,
            open_world_hint=contract.effects.open_world,
        ),
    )


def _status_tool() -> types.Tool:
    return types.Tool(
        name=TASK_STATUS_TOOL,
        description=(
            "The state of a task and of each of its calls: poll it for a call that was "
            "still running, parked or awaiting approval when it returned."
        ),
        input_schema={
            "type": "object",
            "properties": {"task_id": {"type": "string", "minLength": 1, "maxLength": 1000}},
            "required": ["task_id"],
        },
        annotations=types.ToolAnnotations(
            title="onceflow task status",
            read_only_hint=True,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=False,
        ),
    )


def build_mcp_server(
    service: BoundaryService,
    principal_of: PrincipalResolver,
    *,
    session_task: Mapping[str, Any] | None = None,
    close_timeout: float = SESSION_CLOSE_TIMEOUT,
    task_wait: float = TASK_WAIT_SECONDS,
) -> "BoundaryMcpServer":
    """An MCP server whose tools call ``service`` as the principal ``principal_of`` finds.

    Args:
        service: The boundary every call goes through.
        principal_of: Who a request acts as (``fixed_principal``, ``bearer_principal``).
        session_task: The body each session's task is opened with, as for
            ``POST /v1/tasks``: ``open`` (``idle_timeout``, ``max_lifetime``) and
            ``budget``. Default ``{"open": {}}``: the boundary's defaults (30 minutes
            idle, 1 day, the default retry budget).
        close_timeout: Seconds a session's end waits for its tasks to close (and the
            run's end for calls whose clients stopped waiting). Default
            ``SESSION_CLOSE_TIMEOUT``.
        task_wait: Seconds a call of a client that declared the tasks extension may
            take before it is answered with a task (``_mcp_tasks``). Default
            ``TASK_WAIT_SECONDS``.
    """
    task_body = dict(session_task) if session_task is not None else {"open": {}}

    @asynccontextmanager
    async def lifespan(server: Server[McpSessions]) -> AsyncIterator[McpSessions]:
        sessions = McpSessions(service, task_body=task_body, close_timeout=close_timeout)
        try:
            yield sessions
        finally:
            # The run ends (stdio input closed, the HTTP server shutting down, a client in
            # process leaving): even when cancelled, its sessions' tasks get their bounded
            # chance to close.
            with anyio.CancelScope(shield=True):
                await sessions.end_all()

    async def list_tools(
        ctx: ServerRequestContext[McpSessions, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        try:
            principal = await principal_of(ctx)
        except OnceflowError as refused:
            code = types.INTERNAL_ERROR if refused.status >= 500 else types.INVALID_REQUEST
            raise MCPError(code=code, message=refused.detail) from None
        # What a principal may not call stays unlisted: its schema and annotations are
        # none of its business (a call of it is still refused, 403, as over HTTP).
        in_session = ctx.lifespan_context.has_session(ctx)
        tools = [
            tool_definition(contract, in_session=in_session)
            for contract in service.catalogue
            if principal.may_call(contract.name)
        ]
        return types.ListToolsResult(tools=[*tools, _status_tool()])

    async def call_tool(
        ctx: ServerRequestContext[McpSessions, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        arguments = dict(params.arguments or {})
        try:
            principal = await principal_of(ctx)
            if params.name == TASK_STATUS_TOOL:
                status = await service.task_status(principal, str(arguments.get("task_id", "")))
                return _result(status.model_dump(mode="json"), is_error=False)
            if params.name not in service.catalogue:
                raise UnknownToolRequested("no tool of that name exists")
            service.check_tool(principal, params.name)
            contract = service.catalogue.get(params.name)
            raw_key = arguments.pop(IDEMPOTENCY_KEY_ARGUMENT, None)
            key = raw_key if isinstance(raw_key, str) else None
            deliberate: Any = False
            if contract.deliberate_repeats:
                deliberate = arguments.pop(DELIBERATE_REPEAT_ARGUMENT, False)
            sessions = ctx.lifespan_context
            what = f"a call of {params.name} (request {ctx.request_id})"
            session = sessions.session_of(ctx)
            if session is None:
                if not isinstance(deliberate, bool):
                    raise InvalidRequest(
                        "deliberate_repeat must be true or false",
                        errors=[{"loc": ["deliberate_repeat"], "msg": "Input should be a boolean"}],
                    )
                call = service.call_tool(
                    principal, params.name, arguments, key, deliberate_repeat=deliberate
                )
                return _answer(await sessions.finish(call, what))
            in_task = session.call(principal, contract, arguments, key, deliberate)
            return _call_answer(await sessions.finish(in_task, what))
        except UnknownToolRequested as unknown:
            raise MCPError(code=types.INVALID_PARAMS, message=unknown.detail) from None
        except OnceflowError as refused:
            return _result(refused.problem(), is_error=True)

    server = BoundaryMcpServer(
        service,
        "onceflow",
        version="1",
        # What ``initialize`` answers: only the handshake era has it, with a session.
        instructions=SESSION_INSTRUCTIONS,
        lifespan=lifespan,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )

    async def discover(
        ctx: ServerRequestContext[McpSessions, Any], params: types.RequestParams | None
    ) -> types.DiscoverResult:
        # The SDK's own answer, with the instructions of the era the request is in.
        in_session = ctx.lifespan_context.has_session(ctx)
        return types.DiscoverResult(
            supported_versions=list(MODERN_PROTOCOL_VERSIONS),
            capabilities=server.get_capabilities(protocol_version=ctx.protocol_version),
            instructions=SESSION_INSTRUCTIONS if in_session else STATELESS_INSTRUCTIONS,
        )

    server.add_request_handler("server/discover", types.RequestParams, discover)
    tasks = DurableTasks(service, principal_of, _answer, wait_seconds=task_wait)
    apply_extension(server, tasks, call_tool)
    return server


def fixed_principal(principal: Principal) -> PrincipalResolver:
    """The resolver for stdio: one principal, authenticated at start-up."""

    async def resolve(ctx: ServerRequestContext[Any, Any]) -> Principal:
        return principal

    return resolve


def bearer_principal(service: BoundaryService) -> PrincipalResolver:
    """The resolver for streamable HTTP: the request's ``Authorization: Bearer`` key (the
    principal the HTTP gate authenticated for the request, when it passed one)."""

    async def resolve(ctx: ServerRequestContext[Any, Any]) -> Principal:
        scope = getattr(ctx.request, "scope", None)
        state = scope.get("state") if isinstance(scope, dict) else None
        gated = state.get(_PRINCIPAL_STATE) if isinstance(state, dict) else None
        if isinstance(gated, Principal):
            return gated
        headers = getattr(ctx.request, "headers", None)
        return await service.authenticate(
            _bearer_key(headers.get("authorization", "") if headers is not None else "")
        )

    return resolve


def _bearer_key(authorization: str) -> str | None:
    scheme, _, credentials = authorization.partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else None


# ── streamable HTTP: no request reaches the SDK unauthenticated ─────────────────────


class BoundaryMcpServer(Server[McpSessions]):
    """The SDK's server, whose streamable HTTP app lets no request without a valid API
    key through to the SDK (``initialize`` and ``tools/list`` included).

    Made by ``build_mcp_server``; ``streamable_http_app`` takes the SDK's options.
    """

    def __init__(self, service: BoundaryService, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._service = service

    def streamable_http_app(self, **options: Any) -> Starlette:
        """The SDK's streamable HTTP app behind ``BearerGate``."""
        app = super().streamable_http_app(**options)
        # Outermost of the app's own middleware: before routing, the transport's checks
        # and the session manager, so an unauthenticated request touches no session.
        app.add_middleware(BearerGate, service=self._service)
        return app


class BearerGate:
    """ASGI middleware: every HTTP request authenticates with ``Authorization: Bearer``.

    No key, another scheme, or an unknown or revoked key is answered ``401`` with
    ``WWW-Authenticate: Bearer realm="onceflow"`` and a problem document, the database
    being unreachable ``503`` with ``Retry-After``; nothing behind the gate runs. The
    principal goes on in the request's state, so the handlers do not look it up again.
    """

    def __init__(self, app: ASGIApp, service: BoundaryService) -> None:
        self._app = app
        self._service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan: the SDK's session manager starts and stops
            await self._app(scope, receive, send)
            return
        key = _bearer_key(Headers(scope=scope).get("authorization", ""))
        try:
            principal = await self._service.authenticate(key)
        except OnceflowError as refused:
            await _problem_response(refused)(scope, receive, send)
            return
        state = {**scope.get("state", {}), _PRINCIPAL_STATE: principal}
        await self._app({**scope, "state": state}, receive, send)


def _problem_response(refused: OnceflowError) -> Response:
    """The refusal as the HTTP API answers it: ``application/problem+json``."""
    headers: dict[str, str] = {}
    if refused.status == 401:
        headers["WWW-Authenticate"] = WWW_AUTHENTICATE
    if isinstance(refused, BackendUnavailable):
        headers["Retry-After"] = str(refused.retry_after_seconds)
    body = json.dumps(refused.problem(), sort_keys=True, separators=(",", ":"))
    return Response(body, status_code=refused.status, media_type=PROBLEM_JSON, headers=headers)


# ── results ─────────────────────────────────────────────────────────────────────────

_NO_EFFECT_STATES = frozenset({StepState.FAILED, StepState.DENIED, StepState.ABANDONED})


def _call_answer(answer: BoundaryAnswer) -> types.CallToolResult:
    """A call of the session's task: a sentence for the model, then the call's view."""
    view = CallView.model_validate(answer.body)
    result = types.CallToolResult(
        content=[
            types.TextContent(text=_call_message(view)),
            types.TextContent(text=json.dumps(answer.body, sort_keys=True)),
        ],
        structured_content=answer.body,
        is_error=view.state in _NO_EFFECT_STATES,
    )
    result.meta = {REPLAYED_META: answer.replayed}
    return result


def _call_message(view: CallView) -> str:
    """What a model should read: the call's state, where it is, and what to do next."""
    where = f"call {view.step_id} of task {view.task_id}"
    repeat = (
        f" It has the same tool and arguments as call {view.repeat_of} of this task, so "
        "that call answered it: nothing ran again."
        if view.repeat_of
        else ""
    )
    ask_again = (
        f"To learn the outcome, call {TASK_STATUS_TOOL} with this task_id, or call "
        f"{view.tool} again with the same idempotency_key and arguments."
    )
    reason = view.failure_reason or "no reason was given"
    match view.state:
        case StepState.SUCCEEDED:
            return f"{view.tool} succeeded ({where}).{repeat}"
        case StepState.FAILED:
            return f"{view.tool} failed ({where}): {reason}.{repeat}"
        case StepState.DENIED:
            return f"A person denied {view.tool} ({where}): {reason}. It did not run.{repeat}"
        case StepState.ABANDONED:
            return f"{view.tool} was abandoned ({where}): {reason}.{repeat}"
        case StepState.AWAITING_APPROVAL:
            return (
                f"{view.tool} awaits a person's approval ({where}): a person is deciding "
                f"whether it may run.{repeat} Do not call it again, with this or a new "
                f"idempotency_key: that cannot speed the decision up. {ask_again}"
            )
        case StepState.PARKED:
            return (
                f"{view.tool} is parked ({where}): whether it took effect is uncertain "
                f"({view.park_reason or 'no reason was given'}), and a person is finding "
                f"out.{repeat} Do not call it again, with this or a new idempotency_key: its "
                f"effect may already exist. "
                f"{ask_again}"
            )
    ended = "" if view.task_state is TaskState.RUNNING else f" (the task is {view.task_state})"
    return (
        f"{view.tool} is still running ({where}){ended}.{repeat} Do not send it again under "
        f"a new idempotency_key. {ask_again}"
    )


def _answer(answer: BoundaryAnswer) -> types.CallToolResult:
    """A call outside any session: a sentence for the model, then its one-step task's
    view."""
    body = answer.body
    result = types.CallToolResult(
        content=[
            types.TextContent(text=_task_message(body)),
            types.TextContent(text=json.dumps(body, sort_keys=True)),
        ],
        structured_content=body,
        is_error=body.get("state") == TaskState.FAILED.value,
    )
    result.meta = {REPLAYED_META: answer.replayed}
    return result


def _task_message(body: dict[str, Any]) -> str:
    """What a model should read of a call that is a task of its own (no session)."""
    steps = body.get("steps") or [{}]
    step, task_id = steps[-1], body.get("task_id")
    tool, state = step.get("tool", "the tool"), step.get("state")
    ask_again = (
        f"To learn the outcome, call {tool} again with the same idempotency_key and "
        f"arguments, or call {TASK_STATUS_TOOL} with this task_id; a new "
        "idempotency_key would be a new call."
    )
    match state:
        case StepState.SUCCEEDED.value:
            made = f", effect {step['resource_id']}" if step.get("resource_id") else ""
            return f"{tool} succeeded (task {task_id}{made})."
        case StepState.AWAITING_APPROVAL.value:
            return (
                f"{tool} awaits a person's approval (task {task_id}): a person is deciding "
                f"whether it may run. Do not call it under a new idempotency_key. {ask_again}"
            )
        case StepState.PARKED.value:
            return (
                f"{tool} is parked (task {task_id}): whether it took effect is uncertain, "
                "and a person is finding out. Do not call it under a new idempotency_key: "
                f"its effect may already exist. {ask_again}"
            )
        case StepState.FAILED.value | StepState.DENIED.value | StepState.ABANDONED.value:
            reason = step.get("failure_reason") or "no reason was given"
            return f"{tool} ended {state} (task {task_id}): {reason}."
    return f"{tool} is still running (task {task_id}). {ask_again}"


def _result(body: dict[str, Any], *, is_error: bool) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(body, sort_keys=True))],
        structured_content=body,
        is_error=is_error,
    )
