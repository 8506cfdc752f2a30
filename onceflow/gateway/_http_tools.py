"""The HTTP API's tool routes: the catalogue, and a tool called as a one-step task.

Each tool has a documented route of its own (``POST /v1/tools/{name}/calls``), so the
document shows its exact argument schema; the generic route takes any name and answers
an unknown one 404.

The routes are the app's own, not an included router's: FastAPI matches an included
router's routes twice per request (once to pick the router, again to pick the route
inside it), and a tool call, replays included, is the gateway's most frequent request.
"""

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import FastAPI, Path, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel

from onceflow.gateway._http_answers import (
    AUTHENTICATED,
    NAMED_TOOL_CALL_PROBLEMS,
    TOOL_CALL_PROBLEMS,
    answer_response,
    tool_call_answers,
)
from onceflow.gateway._http_json import SortedJSONResponse, parse_json, read_body, sent_key
from onceflow.gateway._http_parameters import (
    BEARER,
    KEY_HEADER_DOC,
    api_key,
    key_header,
    service_of,
)
from onceflow.gateway._http_repeats import request_digest, tool_call_path
from onceflow.gateway._openapi import problem_answers
from onceflow.gateway._openapi_document import model_body, tool_arguments_body
from onceflow.tools.worker import Catalogue


class ToolDescription(BaseModel):
    """A tool an agent may call, with its effect contract as MCP annotations."""

    name: str
    description: str
    annotations: dict[str, Any]
    input_schema: dict[str, Any]
    requires_approval: bool
    dedupe: str


def install_tool_routes(app: FastAPI, catalogue: Catalogue) -> None:
    """Add the tool routes to ``app``, one documented route per tool of ``catalogue``."""

    @app.get(
        "/v1/tools",
        tags=["tools"],
        response_model=list[ToolDescription],
        responses=problem_answers(AUTHENTICATED),
        openapi_extra=BEARER,
    )
    async def list_tools(request: Request) -> list[ToolDescription]:
        """The catalogue: each tool's input schema and effect contract."""
        service = service_of(request)
        await service.authenticate(api_key(request))
        return [
            ToolDescription(
                name=contract.name,
                description=contract.description,
                annotations=contract.mcp_annotations(),
                input_schema=contract.input_model.model_json_schema(),
                requires_approval=contract.requires_approval,
                dedupe=contract.dedupe.value,
            )
            for contract in service.catalogue
        ]

    # One documented route per tool, so each shows its exact argument schema...
    for contract in catalogue:
        app.add_api_route(
            tool_call_path(contract.name),
            _named_tool_endpoint(contract.name),
            methods=["POST"],
            tags=["tools"],
            summary=f"Call {contract.name}",
            description=(
                f"{contract.description} Effects: {contract.dedupe.value} dedupe"
                f"{', needs approval' if contract.requires_approval else ''}. Runs as a "
                "one-step task; the body is the tool's arguments."
            ),
            responses=tool_call_answers(NAMED_TOOL_CALL_PROBLEMS),
            response_class=SortedJSONResponse,
            openapi_extra={
                **BEARER,
                "parameters": [key_header(KEY_HEADER_DOC)],
                "requestBody": model_body(contract.input_model),
            },
            operation_id=f"call_{contract.name}",
        )

    # ...and the generic route for any name (unknown ones answer 404).
    @app.post(
        "/v1/tools/{tool}/calls",
        tags=["tools"],
        responses=tool_call_answers(TOOL_CALL_PROBLEMS),
        response_class=SortedJSONResponse,
        openapi_extra={
            **BEARER,
            "parameters": [key_header(KEY_HEADER_DOC)],
            "requestBody": tool_arguments_body(catalogue),
        },
    )
    async def call_tool(
        request: Request,
        tool: Annotated[str, Path(description="Tool name (see GET /v1/tools).")],
        deliberate_repeat: DeliberateRepeatParameter = False,
    ) -> Response:
        """Call one tool as a one-step task; the body is the tool's arguments."""
        return await _call(request, tool, deliberate_repeat)


DeliberateRepeatParameter = Annotated[
    bool,
    Query(
        description="`true`: make a second effect identical to an earlier call's on "
        "purpose (recorded as such). Without it, a call of the same business intent as "
        "an earlier one (see the tool's intent in GET /v1/tools) under any key is answered "
        "by that call (`result.repeat_of`) or refused naming it while its effect is in "
        "doubt. 400 for a tool whose contract allows no deliberate repeat."
    ),
]


def _named_tool_endpoint(tool: str) -> Callable[..., Awaitable[Response]]:
    async def call_named_tool(
        request: Request, deliberate_repeat: DeliberateRepeatParameter = False
    ) -> Response:
        return await _call(request, tool, deliberate_repeat)

    return call_named_tool


async def _call(request: Request, tool: str, deliberate_repeat: bool) -> Response:
    service = service_of(request)
    principal = await service.authenticate(api_key(request))
    service.check_tool(principal, tool)
    key = sent_key(request)
    body = await read_body(request)
    digest = request_digest(tool, deliberate_repeat, body)
    if key:
        repeated = service.repeated_tool_call(principal, tool, key, digest)
        if repeated is not None:
            return answer_response(repeated)
    return answer_response(
        await service.call_tool(
            principal,
            tool,
            parse_json(body),
            key,
            deliberate_repeat=deliberate_repeat,
            request_digest=digest,
        )
    )
