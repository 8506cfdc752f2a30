"""The boundary over MCP: each catalogue tool, with its effect contract as annotations.

Every tool takes an ``idempotency_key`` argument beside the tool's own; a call goes
through ``BoundaryService`` exactly like ``POST /v1/tools/{tool}/calls`` (same scope and
fingerprint, so an HTTP call and its MCP retry with the same key are one operation).
Boundary refusals come back as tool results with ``isError`` and the problem document,
so the model can read why; an unknown tool is a protocol error.

Over stdio the principal is fixed by ``ONCEFLOW_API_KEY``; over streamable HTTP each
request authenticates with its own ``Authorization: Bearer`` header.
"""

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from onceflow.gateway._errors import BoundaryError, UnknownToolRequested
from onceflow.gateway._principals import Principal
from onceflow.gateway._service import BoundaryAnswer, BoundaryService
from onceflow.tools import IDEMPOTENCY_KEY_MAX_LENGTH, ToolContract
from onceflow.workflows.task_models import TaskState

log = logging.getLogger("onceflow.gateway")

IDEMPOTENCY_KEY_ARGUMENT = "idempotency_key"
TASK_STATUS_TOOL = "onceflow_task_status"
"""A read-only tool to poll a task that was still running when its call returned."""
REPLAYED_META = "onceflow/replayed"

PrincipalResolver = Callable[[ServerRequestContext[Any, Any]], Awaitable[Principal]]


def tool_definition(contract: ToolContract) -> types.Tool:
    """The MCP tool of a contract: its arguments plus ``idempotency_key``, and annotations."""
    schema = contract.input_model.model_json_schema()
    properties = dict(schema.get("properties", {}))
    properties[IDEMPOTENCY_KEY_ARGUMENT] = {
        "type": "string",
        "minLength": 1,
        "maxLength": IDEMPOTENCY_KEY_MAX_LENGTH,
        "pattern": r"^[A-Za-z0-9][A-Za-z0-9._:-]*$",
        "description": (
            "Identifies this logical call: send the same key when retrying it, a new key "
            "for a new call. The same key with other arguments is refused."
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
        description="The state and step results of a task started by an earlier tool call.",
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


def build_mcp_server(service: BoundaryService, principal_of: PrincipalResolver) -> Server[Any]:
    """An MCP server whose tools call ``service`` as the principal ``principal_of`` finds."""

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = [tool_definition(contract) for contract in service.catalogue]
        return types.ListToolsResult(tools=[*tools, _status_tool()])

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        arguments = dict(params.arguments or {})
        try:
            principal = await principal_of(ctx)
            if params.name == TASK_STATUS_TOOL:
                status = await service.task_status(principal, str(arguments.get("task_id", "")))
                return _result(status.model_dump(mode="json"), is_error=False)
            if params.name not in service.catalogue:
                raise UnknownToolRequested("no tool of that name exists")
            key = arguments.pop(IDEMPOTENCY_KEY_ARGUMENT, None)
            answer = await service.call_tool(
                principal, params.name, arguments, key if isinstance(key, str) else None
            )
            return _answer(answer)
        except UnknownToolRequested as unknown:
            raise MCPError(code=types.INVALID_PARAMS, message=unknown.detail) from None
        except BoundaryError as refused:
            return _result(refused.problem(), is_error=True)

    return Server(
        "onceflow",
        version="1",
        instructions=(
            "Tools with effects take an idempotency_key: reuse it when you retry a call, "
            "use a new one for a new call. A call that returns state 'running', "
            f"'awaiting_approval' or 'parked' can be polled with {TASK_STATUS_TOOL}."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def fixed_principal(principal: Principal) -> PrincipalResolver:
    """The resolver for stdio: one principal, authenticated at start-up."""

    async def resolve(ctx: ServerRequestContext[Any, Any]) -> Principal:
        return principal

    return resolve


def bearer_principal(service: BoundaryService) -> PrincipalResolver:
    """The resolver for streamable HTTP: the request's ``Authorization: Bearer`` key."""

    async def resolve(ctx: ServerRequestContext[Any, Any]) -> Principal:
        headers = getattr(ctx.request, "headers", None)
        authorization = headers.get("authorization", "") if headers is not None else ""
        scheme, _, credentials = authorization.partition(" ")
        key = credentials.strip() if scheme.lower() == "bearer" else None
        return await service.authenticate(key)

    return resolve


def _answer(answer: BoundaryAnswer) -> types.CallToolResult:
    result = _result(answer.body, is_error=answer.body.get("state") == TaskState.FAILED.value)
    result.meta = {REPLAYED_META: answer.replayed}
    return result


def _result(body: dict[str, Any], *, is_error: bool) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(body, sort_keys=True))],
        structured_content=body,
        is_error=is_error,
    )
