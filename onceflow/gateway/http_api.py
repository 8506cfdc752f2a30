"""The boundary over HTTP: a FastAPI app whose routes all call ``BoundaryService``.

Errors are RFC 9457 ``application/problem+json`` documents; a repeated request is
answered from its idempotency record with ``Idempotent-Replayed: true``. The OpenAPI
document is served at ``/openapi.json`` and rendered at ``/docs`` (Swagger UI) and
``/redoc``, both pages from assets the gateway serves itself, so they work offline.

Parsing is strict: a body is read only when it is sent as JSON (415 otherwise), its
values are validated without coercion (``_strict``), and ``Idempotency-Key`` is one
header with one key, bare or in the structured-field string form (``"abc"``, the IETF
draft's own form), both meaning the same key.
"""

import ast
import inspect
import json
import logging
import math
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Annotated, Any, Literal

import psycopg
from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from psycopg_pool import PoolTimeout
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from temporalio.service import RPCError

from onceflow.encryption import PayloadEncryptionSettings
from onceflow.errors import (
    BackendUnavailable,
    CallRefused,
    DecisionConflict,
    DecisionRefused,
    DecisionsNotAllowed,
    InvalidRequest,
    KeyReusedWithDifferentRequest,
    MalformedIdempotencyKey,
    MissingIdempotencyKey,
    NotReady,
    OnceflowError,
    QuotaExceeded,
    RequestInProgress,
    RequestTooLarge,
    TaskBusy,
    TaskNotFound,
    TaskNotOpen,
    TaskUnanswered,
    ToolNotAllowed,
    Unauthenticated,
    UnknownToolRequested,
    UnsupportedMediaType,
    validation_problems,
)
from onceflow.gateway._backend import TEMPORAL_UNREACHABLE
from onceflow.gateway._codec_endpoint import install_codec_endpoint
from onceflow.gateway._fingerprint import API_VERSION
from onceflow.gateway._openapi import (
    DECISION_ANSWER_HEADERS,
    PROBLEM_JSON,
    REPLAYED_HEADER,
    TASK_ANSWER_HEADERS,
    durations_in_seconds,
    finish_document,
    problem_answers,
)
from onceflow.gateway._requests import (
    ApproveRequest,
    BoundaryAnswer,
    CallRequest,
    CreateOpenTaskRequest,
    CreateTaskRequest,
    DecisionReply,
    ReconcileRequest,
)
from onceflow.gateway._responses import CallView, Readiness, TaskView
from onceflow.gateway._service import BoundaryService
from onceflow.task_api import DecisionAnswer
from onceflow.tools import CATALOGUE, IDEMPOTENCY_KEY_MAX_LENGTH, Catalogue
from onceflow.workflows.task_models import NAME_PATTERN, StepStatus, TaskStatus

log = logging.getLogger("onceflow.gateway")

MAX_BODY_BYTES = 256 * 1024
"""Largest request body read; larger ones are refused before parsing."""
_BARE_KEY = r"[A-Za-z0-9][A-Za-z0-9._:-]*"
_KEY_PATTERN = rf'^({_BARE_KEY}|"{_BARE_KEY}")$'
"""A key, bare or as a structured-field string (RFC 8941 sf-string), which the draft
``Idempotency-Key`` header (draft-ietf-httpapi-idempotency-key-header) defines it as."""
DOCS_ASSETS = "/docs/assets"
"""Where the docs pages' JavaScript and CSS are served from (the ``fastapi-offline``
package's copies of Swagger UI and ReDoc)."""
UNAVAILABLE_RETRY_AFTER_SECONDS = 2
"""``Retry-After`` of a 503 the service did not raise itself (see ``_as_backend_error``)."""

ServiceOpener = Callable[[], AbstractAsyncContextManager[BoundaryService]]


class ToolDescription(BaseModel):
    """A tool an agent may call, with its effect contract as MCP annotations."""

    name: str
    description: str
    annotations: dict[str, Any]
    input_schema: dict[str, Any]
    requires_approval: bool
    dedupe: str


class Health(BaseModel):
    """Liveness of the gateway process."""

    status: str = Field(examples=["ok"])


class Ready(BaseModel):
    """Readiness: PostgreSQL and Temporal both answered."""

    status: Literal["ready"] = "ready"
    checks: dict[str, str] = Field(examples=[{"database": "ok", "temporal": "ok"}])
    """``database`` and ``temporal``, each ``ok``."""


class SortedJSONResponse(JSONResponse):
    """JSON with sorted keys, so a body read back from ``jsonb`` is byte-for-byte the same."""

    def render(self, content: Any) -> bytes:
        return json.dumps(
            content, ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
        ).encode()


def _problem_response(error: OnceflowError) -> Response:
    headers: dict[str, str] = {REPLAYED_HEADER: "true"} if error.replayed else {}
    retry_after = error.retry_after_seconds
    if retry_after is None and error.status == 503:
        retry_after = UNAVAILABLE_RETRY_AFTER_SECONDS
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    if error.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="onceflow"'
    return SortedJSONResponse(
        error.problem(), status_code=error.status, media_type=PROBLEM_JSON, headers=headers
    )


def _decision_response(reply: DecisionReply) -> Response:
    headers = {REPLAYED_HEADER: "true"} if reply.replayed else {}
    return SortedJSONResponse(reply.body, headers=headers)


def _answer_response(answer: BoundaryAnswer) -> Response:
    headers = {"Content-Location": answer.status_url}
    if answer.replayed:
        headers[REPLAYED_HEADER] = "true"
    if answer.in_progress:
        headers["Location"] = answer.status_url
        headers["Retry-After"] = "1"
    if answer.created:
        headers["Location"] = answer.status_url
    return SortedJSONResponse(answer.body, status_code=answer.status_code, headers=headers)


# What each route may refuse with: its documented error answers are built from these.
_AUTHENTICATED = (Unauthenticated, BackendUnavailable)
_KEYED_BODY = (
    MissingIdempotencyKey,
    MalformedIdempotencyKey,
    InvalidRequest,
    RequestTooLarge,
    UnsupportedMediaType,
    KeyReusedWithDifferentRequest,
    RequestInProgress,
    QuotaExceeded,
)
_TOOL_CALL_PROBLEMS = (*_AUTHENTICATED, ToolNotAllowed, UnknownToolRequested, *_KEYED_BODY)
_NAMED_TOOL_CALL_PROBLEMS = tuple(
    kind for kind in _TOOL_CALL_PROBLEMS if kind is not UnknownToolRequested
)
_TASK_CALL_PROBLEMS = (
    *_TOOL_CALL_PROBLEMS,
    TaskNotFound,
    CallRefused,
    TaskNotOpen,
    TaskBusy,
    TaskUnanswered,
)
_DECISION_PROBLEMS = (
    *_AUTHENTICATED,
    DecisionsNotAllowed,
    TaskNotFound,
    *(kind for kind in _KEYED_BODY if kind is not MissingIdempotencyKey),
    DecisionRefused,
    DecisionConflict,
    TaskBusy,
    TaskUnanswered,
)
_TASK_READ_PROBLEMS = (*_AUTHENTICATED, TaskNotFound, InvalidRequest, TaskUnanswered)

_TASK_ENDED = {
    "model": TaskView,
    "description": "The task ended (succeeded or failed). With `Idempotent-Replayed: "
    "true` this is the stored answer of an earlier request with the same key.",
    "headers": TASK_ANSWER_HEADERS[200],
}
_TASK_GOING = {
    "model": TaskView,
    "description": "The task is still running, awaiting approval or parked after the "
    "bounded wait; poll `Location`. Retrying with the same key is safe.",
    "headers": TASK_ANSWER_HEADERS[202],
}


def _tool_call_answers(problems: tuple[type[OnceflowError], ...]) -> dict[int | str, Any]:
    return {200: _TASK_ENDED, 202: _TASK_GOING, **problem_answers(problems)}


_CREATE_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: _TASK_ENDED,
    201: {
        "model": TaskView,
        "description": "An open task was created (`open: true`, no calls yet); `Location` "
        "is its status. The same key and body answer 201 with the same task while it is "
        "open (`Idempotent-Replayed: true`), and its stored final view (200, state "
        "`closed`) once it has closed.",
        "headers": TASK_ANSWER_HEADERS[201],
    },
    202: _TASK_GOING,
    **problem_answers(_TOOL_CALL_PROBLEMS),
}
_CALL_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {
        "model": CallView,
        "description": "The call ended (`ended: true`; state succeeded, failed, denied or "
        "abandoned): its final answer. `repeat_of` is set when the repeat guard answered "
        "it with an earlier identical call of the task (nothing ran). With "
        "`Idempotent-Replayed: true` this is the stored answer of an earlier request with "
        "the same key.",
        "headers": TASK_ANSWER_HEADERS[200],
    },
    202: {
        "model": CallView,
        "description": "The call has not ended: it is parked or awaits approval (a person "
        "decides it), or was still running (or `pending`, not yet taken by the task) when "
        "the bounded wait was over. Send the same request again, same key and body, to "
        "get its current state (`?wait=ended` waits for its end): it is the same call "
        "and never runs twice.",
        "headers": TASK_ANSWER_HEADERS[202],
    },
    **problem_answers(_TASK_CALL_PROBLEMS),
}
_DECISION_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {
        "model": DecisionAnswer,
        "description": "The decision was accepted; or, with `Idempotent-Replayed: true` and "
        "`replayed`, the step had already been decided exactly this way (a repeat whose "
        "answer was lost) and `decision` is that earlier decision: nothing new was recorded. "
        "With `Idempotent-Replayed: true` after a request with the same `Idempotency-Key` "
        "and body, this is that request's stored answer, byte for byte.",
        "headers": DECISION_ANSWER_HEADERS,
    },
    **problem_answers(_DECISION_PROBLEMS),
}
_KEY_FORMS_DOC = (
    f"At most {IDEMPOTENCY_KEY_MAX_LENGTH} characters of A-Z a-z 0-9 . _ : - "
    "starting with a letter or digit, sent bare (`abc`) or as a structured-field string "
    '(`"abc"`, RFC 8941), which is the same key. One header line with one key: a repeated '
    "header or a list is refused (400 `idempotency-key-malformed`)."
)
_KEY_HEADER_DOC = (
    "Identifies one logical attempt; send the same key with every retry of it. "
    f"{_KEY_FORMS_DOC} "
    "Scoped to the principal and the tool (or task creation, or calls of open tasks)."
)
_KEY_SCHEMA = {
    "pattern": _KEY_PATTERN,
    "maxLength": IDEMPOTENCY_KEY_MAX_LENGTH + 2,
    "minLength": 1,
}

# The three key headers are declared for the document only: a handler reads every line of
# the header itself (``_sent_key``), since FastAPI would hand it the first of several.
IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description=_KEY_HEADER_DOC,
        json_schema_extra=_KEY_SCHEMA,
    ),
]
_DECISION_KEY_HEADER_DOC = (
    "Optional on decisions; when sent, it works as on every other POST. Identifies one "
    "decision request: the same key and body answer again with the first answer (its "
    "status and body, a 409 refusal included, even after the task ended), flagged "
    "`Idempotent-Replayed: true`; the same key with another body, or for another task, "
    f"is refused (422). {_KEY_FORMS_DOC} "
    "Scoped to the principal and the route (approve or "
    "reconcile). Without a key, the task still keeps one decision per step: a repeat of "
    "the decision the step already got answers with it, flagged the same way."
)

DecisionKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description=_DECISION_KEY_HEADER_DOC,
        json_schema_extra=_KEY_SCHEMA,
    ),
]
_bearer = HTTPBearer(auto_error=False, description="An API key from `onceflow principal add`.")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def build_app(
    open_service: ServiceOpener,
    *,
    catalogue: Catalogue = CATALOGUE,
    encryption: PayloadEncryptionSettings | None = None,
) -> FastAPI:
    """The HTTP API around the service ``open_service`` yields for the app's lifetime.

    Args:
        open_service: Opens the boundary service (clients included) for the app's life.
        catalogue: The tools published in the OpenAPI document (the service's own).
        encryption: The payload encryption settings; with keys, the app also serves the
            codec endpoint at ``/codec`` (``gateway._codec_endpoint``), outside the
            OpenAPI document. Default: none.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_service() as service:
            app.state.service = service
            yield

    app = FastAPI(
        title="onceflow gateway",
        version=API_VERSION,
        description=(
            "Retry-safe agent tool calls. Every call that has an effect takes an "
            "`Idempotency-Key`: the same key and body return the same task and result "
            "(flagged `Idempotent-Replayed: true`), the same key with another body is "
            "refused (422). Results are kept for the configured retention; a retry after "
            "that is a new operation. Bodies are JSON (`Content-Type: application/json`), "
            "validated without coercion; every error is an `application/problem+json` "
            "document whose `type` names the failure mode."
        ),
        lifespan=lifespan,
        # Served below from the gateway's own copies of their assets, not from a CDN.
        docs_url=None,
        redoc_url=None,
    )
    _install_error_handlers(app)
    _install_docs_pages(app)
    if encryption is not None and encryption.enabled:
        install_codec_endpoint(
            app,
            encryption,
            principals=lambda request: _service(request).principals,
            namespace=lambda request: _service(request).namespace,
            problem=_problem_response,
        )

    @app.get("/healthz", response_model=Health, tags=["operations"])
    async def healthz() -> Health:
        """Liveness: answers without touching PostgreSQL or Temporal (see `/readyz`)."""
        return Health(status="ok")

    @app.get(
        "/readyz",
        response_model=Ready,
        tags=["operations"],
        responses=problem_answers([NotReady]),
    )
    async def readyz(request: Request) -> Ready:
        """Readiness: 200 when PostgreSQL and Temporal both answer now, 503 (`not-ready`,
        with `Retry-After` and `checks` naming the one that does not) otherwise. Each is
        given `ONCEFLOW_GATEWAY_READINESS_TIMEOUT_SECONDS` (default 2 s); set the probe's
        own timeout longer. Needs no API key."""
        readiness = await _service(request).readiness()
        if not readiness.ready:
            raise NotReady(_not_ready_detail(readiness), checks=readiness.checks())
        return Ready(checks=readiness.checks())

    @app.get(
        "/v1/tools",
        response_model=list[ToolDescription],
        tags=["tools"],
        responses=problem_answers(_AUTHENTICATED),
    )
    async def list_tools(
        request: Request, credentials: Credentials = None
    ) -> list[ToolDescription]:
        """The catalogue: each tool's input schema and effect contract."""
        service = _service(request)
        await service.authenticate(_api_key(credentials))
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

    async def call(
        request: Request, tool: str, credentials: HTTPAuthorizationCredentials | None
    ) -> Response:
        service = _service(request)
        principal = await service.authenticate(_api_key(credentials))
        service.check_tool(principal, tool)
        key = _sent_key(request)
        arguments = await _read_json(request)
        return _answer_response(await service.call_tool(principal, tool, arguments, key))

    # One documented route per tool, so each shows its exact argument schema...
    for contract in catalogue:
        app.add_api_route(
            f"/v1/tools/{contract.name}/calls",
            _named_tool_endpoint(contract.name, call),
            methods=["POST"],
            tags=["tools"],
            summary=f"Call {contract.name}",
            description=(
                f"{contract.description} Effects: {contract.dedupe.value} dedupe"
                f"{', needs approval' if contract.requires_approval else ''}. Runs as a "
                "one-step task; the body is the tool's arguments."
            ),
            responses=_tool_call_answers(_NAMED_TOOL_CALL_PROBLEMS),
            response_class=SortedJSONResponse,
            openapi_extra={"requestBody": _model_body(contract.input_model)},
            operation_id=f"call_{contract.name}",
        )

    # ...and the generic route for any name (unknown ones answer 404).
    @app.post(
        "/v1/tools/{tool}/calls",
        tags=["tools"],
        responses=_tool_call_answers(_TOOL_CALL_PROBLEMS),
        response_class=SortedJSONResponse,
        openapi_extra={"requestBody": _tool_arguments_body(catalogue)},
    )
    async def call_tool(
        request: Request,
        tool: Annotated[str, Path(description="Tool name (see GET /v1/tools).")],
        idempotency_key: IdempotencyKeyHeader = None,
        credentials: Credentials = None,
    ) -> Response:
        """Call one tool as a one-step task; the body is the tool's arguments."""
        return await call(request, tool, credentials)

    @app.post(
        "/v1/tasks",
        tags=["tasks"],
        responses=_CREATE_ANSWERS,
        response_class=SortedJSONResponse,
        openapi_extra={"requestBody": _create_task_body()},
    )
    async def create_task(
        request: Request,
        idempotency_key: IdempotencyKeyHeader = None,
        credentials: Credentials = None,
    ) -> Response:
        """Run tool calls in order as one task under one retry budget (a plan, `steps`),
        or create an open task (`open`) whose calls the agent sends one by one.

        An open task is answered 201 as soon as it runs; send its calls to
        `POST /v1/tasks/{id}/calls` and close it with `POST /v1/tasks/{id}/close` (it also
        closes after `idle_timeout` without calls, and at `max_lifetime`).
        """
        service = _service(request)
        principal = await service.authenticate(_api_key(credentials))
        key = _sent_key(request)
        body = await _read_json(request)
        return _answer_response(await service.create_task(principal, body, key))

    @app.get(
        "/v1/tasks/{task_id}",
        tags=["tasks"],
        response_model=TaskStatus,
        responses=problem_answers(_TASK_READ_PROBLEMS),
    )
    async def get_task(
        request: Request, task_id: TaskId, credentials: Credentials = None
    ) -> TaskStatus:
        """A task's full status: every step's arguments, attempts and evidence.

        For an open task (`open: true`), `steps` lists its calls in arrival order, repeats
        included (`repeat_of`, `deliberate_repeat`); `closing` says why it takes no more
        calls, `runs` how many workflow runs it took (it continues as new when long).
        """
        service = _service(request)
        principal = await service.authenticate(_api_key(credentials))
        return await service.task_status(principal, task_id)

    @app.post(
        "/v1/tasks/{task_id}/calls",
        tags=["tasks"],
        responses=_CALL_ANSWERS,
        response_class=SortedJSONResponse,
        openapi_extra={"requestBody": _model_body(CallRequest)},
    )
    async def call_in_task(
        request: Request,
        task_id: TaskId,
        wait: WaitParameter = "settled",
        idempotency_key: CallKeyHeader = None,
        credentials: Credentials = None,
    ) -> Response:
        """Send one tool call to an open task, under the task's one retry budget.

        The call runs as a step of the task (derived child keys, approval, park,
        reconciliation, evidence). An identical earlier call of the task (same tool and
        arguments) that succeeded, runs, awaits approval or is parked answers it instead
        (`repeat_of`), unless `deliberate_repeat` is set. A call the task cannot take is
        refused with its reason (409 `call-refused`); the refusal is the key's stored
        answer, and nothing is recorded in the task, so a corrected call under a new key
        is not blocked by it. The caller must be allowed the tool, and of the task's
        tenant.
        """
        service = _service(request)
        principal = await service.authenticate(_api_key(credentials))
        key = _sent_key(request)
        body = await _read_json(request)
        return _answer_response(
            await service.call_in_task(
                principal, task_id, body, key, wait_until_ended=wait == "ended"
            )
        )

    @app.post(
        "/v1/tasks/{task_id}/close",
        tags=["tasks"],
        response_model=TaskStatus,
        responses=problem_answers((*_TASK_READ_PROBLEMS, TaskNotOpen)),
        response_class=SortedJSONResponse,
    )
    async def close_task(
        request: Request, task_id: TaskId, credentials: Credentials = None
    ) -> TaskStatus:
        """Close an open task: it takes no more calls (they are refused with the reason)
        and ends, state `closed`, once its unfinished calls end.

        Idempotent by itself, so it takes no Idempotency-Key: closing a closing or closed
        task answers with its status again. A plan answers 409 `task-not-open`.
        """
        service = _service(request)
        principal = await service.authenticate(_api_key(credentials))
        return await service.close_task(principal, task_id)

    @app.post(
        "/v1/tasks/{task_id}/approve",
        tags=["decisions"],
        response_model=DecisionAnswer,
        responses=_DECISION_ANSWERS,
        response_class=SortedJSONResponse,
        openapi_extra={"requestBody": _model_body(ApproveRequest)},
    )
    async def approve(
        request: Request,
        task_id: TaskId,
        idempotency_key: DecisionKeyHeader = None,
        credentials: Credentials = None,
    ) -> Response:
        """Approve or deny a step's exact arguments (bound by their digest)."""
        service = _service(request)
        principal = await service.authenticate(_api_key(credentials))
        key = _sent_key(request)
        body = await _read_json(request)
        return _decision_response(await service.approve(principal, task_id, body, key))

    @app.post(
        "/v1/tasks/{task_id}/reconcile",
        tags=["decisions"],
        response_model=DecisionAnswer,
        responses=_DECISION_ANSWERS,
        response_class=SortedJSONResponse,
        openapi_extra={"requestBody": _model_body(ReconcileRequest)},
    )
    async def reconcile(
        request: Request,
        task_id: TaskId,
        idempotency_key: DecisionKeyHeader = None,
        credentials: Credentials = None,
    ) -> Response:
        """Decide a parked step: happened (with resource_id), did_not_happen, or abandon."""
        service = _service(request)
        principal = await service.authenticate(_api_key(credentials))
        key = _sent_key(request)
        body = await _read_json(request)
        return _decision_response(await service.reconcile(principal, task_id, body, key))

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            published: list[type[BaseModel]] = [
                CreateTaskRequest,
                CreateOpenTaskRequest,
                ApproveRequest,
                ReconcileRequest,
                *(contract.input_model for contract in catalogue),
            ]
            for model in published:
                _add_schema(schemas, model)
            schemas["TaskStepRequest"] = _task_step_schema(catalogue)
            schemas["CallRequest"] = _call_schema(catalogue)
            for model in (TaskStatus, StepStatus):
                _describe_fields(schemas, model)
            durations_in_seconds(schemas, (model.__name__ for model in published))
            _require_idempotency_keys(document)
            finish_document(document)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


TaskId = Annotated[str, Path(description="The task id (its workflow id).", max_length=1000)]
WaitParameter = Annotated[
    Literal["settled", "ended"],
    Query(
        description="`settled` (default): answer when the call ends, parks or awaits "
        "approval. `ended`: answer only once it has ended (a parked or awaiting call waits "
        "for the person's decision). Either way the wait is bounded "
        "(`ONCEFLOW_GATEWAY_REPLAY_WAIT_SECONDS`), then 202 with the call's state. Not "
        "part of the request's fingerprint: the same call may be sent again with either."
    ),
]
_CALL_KEY_HEADER_DOC = (
    "Identifies one call of the task; send the same key with every retry of it (a lost "
    "answer included), a new key for a new call, even one identical to an earlier call "
    "(the task's repeat guard answers that one). The same key and body answer with the "
    "same call, never a second run: its stored final answer, or while it has not ended "
    "its current state; the same key with another call, or for another task, is refused "
    "(422). Without `call_id` in the body, the call's id is derived from the key. "
    f"{_KEY_FORMS_DOC} Scoped to the principal (calls of any task)."
)
CallKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description=_CALL_KEY_HEADER_DOC,
        json_schema_extra=_KEY_SCHEMA,
    ),
]


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OnceflowError)
    async def boundary_error(request: Request, error: OnceflowError) -> Response:
        if error.status >= 500 and not isinstance(error, BackendUnavailable):
            # A process's own failure (settings, a tool's registration), not a refusal.
            return _internal_error(request, error)
        return _problem_response(error)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> Response:
        problems = validation_problems(error.errors())
        return _problem_response(InvalidRequest("invalid request", errors=problems))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> Response:
        problem = {
            "type": "about:blank",
            "title": str(error.detail),
            "status": error.status_code,
            "detail": str(error.detail),
        }
        return SortedJSONResponse(
            problem,
            status_code=error.status_code,
            media_type=PROBLEM_JSON,
            headers=getattr(error, "headers", None),
        )

    # Registered by class, so they answer like the handlers above; only the catch-all
    # below runs where Starlette also re-raises the error to the server.
    @app.exception_handler(PoolTimeout)
    @app.exception_handler(psycopg.OperationalError)
    @app.exception_handler(RPCError)
    async def backend_error(request: Request, error: Exception) -> Response:
        unavailable = _as_backend_error(error)
        if unavailable is None:
            return _internal_error(request, error)
        log.warning(
            "%s on %s %s: answered 503", type(error).__name__, request.method, request.url.path
        )
        return _problem_response(unavailable)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> Response:
        return _internal_error(request, error)


def _internal_error(request: Request, error: Exception) -> Response:
    # The type only: an exception's text could quote request data.
    log.error("unexpected %s on %s %s", type(error).__name__, request.method, request.url.path)
    problem = {
        "type": "about:blank",
        "title": "Internal error",
        "status": 500,
        "detail": "unexpected failure; a retry of the same request (with the same "
        "Idempotency-Key where it takes one) is safe",
    }
    return SortedJSONResponse(problem, status_code=500, media_type=PROBLEM_JSON)


def _as_backend_error(error: Exception) -> BackendUnavailable | None:
    """An unreachable backend that escaped the service's own translation, as the 503 it
    is: a request must never get a 500 (no ``Retry-After``) for an outage."""
    if isinstance(error, PoolTimeout | psycopg.OperationalError):
        return BackendUnavailable("the database is unreachable; retry with the same key")
    if isinstance(error, RPCError) and error.status in TEMPORAL_UNREACHABLE:
        return BackendUnavailable("the task service is unreachable; retry with the same key")
    return None


def _install_docs_pages(app: FastAPI) -> None:
    """``/docs`` (Swagger UI) and ``/redoc``, their scripts and styles served by the
    gateway itself: a gateway without internet access still shows its documentation."""
    app.mount(
        DOCS_ASSETS, StaticFiles(packages=[("fastapi_offline", "static")]), name="docs-assets"
    )

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}/openapi.json",
            title=f"{app.title}: API",
            swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
            # Swagger UI would otherwise send the document to a public validator.
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}/openapi.json",
            title=f"{app.title}: API",
            redoc_js_url=f"{root}{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
            with_google_fonts=False,
        )


def _not_ready_detail(readiness: Readiness) -> str:
    down = [
        name
        for name, answered in (("PostgreSQL", readiness.database), ("Temporal", readiness.temporal))
        if not answered
    ]
    return f"{' and '.join(down)} {'is' if len(down) == 1 else 'are'} unreachable"


def _service(request: Request) -> BoundaryService:
    service: BoundaryService = request.app.state.service
    return service


def _api_key(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    return credentials.credentials if credentials is not None else None


def _sent_key(request: Request) -> str | None:
    """The ``Idempotency-Key`` the request carries, bare; None without one.

    Raises:
        MalformedIdempotencyKey: The header is repeated, holds a list, or is a malformed
            structured-field string (the key's own alphabet is the service's check).
    """
    lines = request.headers.getlist("idempotency-key")
    if not lines:
        return None
    if len(lines) > 1:
        raise MalformedIdempotencyKey(_ONE_KEY)
    value = lines[0]
    if value.startswith('"'):
        return _sf_string(value)
    if "," in value:
        raise MalformedIdempotencyKey(_ONE_KEY)
    return value


_ONE_KEY = (
    "send exactly one Idempotency-Key: one header line with one key (a repeated header "
    "or a list is ambiguous about which attempt this is)"
)


def _sf_string(value: str) -> str:
    """The content of an RFC 8941 sf-string that is the whole of ``value``."""
    content: list[str] = []
    escaped = False
    for position, char in enumerate(value[1:], start=1):
        if escaped:
            if char not in '"\\':
                break
            content.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            if position != len(value) - 1:
                # Parameters, or a list of keys: neither is one key.
                raise MalformedIdempotencyKey(_ONE_KEY)
            if not content:
                break
            return "".join(content)
        elif not " " <= char <= "~":
            break
        else:
            content.append(char)
    raise MalformedIdempotencyKey(
        'a quoted Idempotency-Key must be one structured-field string ("abc") holding the key'
    )


async def _read_json(request: Request) -> Any:
    declared_types = request.headers.getlist("content-type")
    if declared_types and not _is_json(declared_types):
        raise UnsupportedMediaType(_JSON_ONLY)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise RequestTooLarge(f"the body may be at most {MAX_BODY_BYTES} bytes")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise RequestTooLarge(f"the body may be at most {MAX_BODY_BYTES} bytes")
    if not raw.strip():
        raise InvalidRequest(
            "the body must be a JSON document", errors=[{"loc": [], "msg": "empty body"}]
        )
    if not declared_types:
        # A body that does not say what it is is not taken for JSON.
        raise UnsupportedMediaType(_JSON_ONLY)
    try:
        return json.loads(
            raw,
            parse_constant=_not_json,
            parse_float=_finite_float,
            object_pairs_hook=_object_without_repeats,
        )
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        reason = getattr(error, "msg", None) or "not UTF-8"
        raise InvalidRequest(
            "the body is not valid JSON", errors=[{"loc": [], "msg": str(reason)}]
        ) from None
    except _NotStrictJson as error:
        raise InvalidRequest(
            "the body is not valid JSON", errors=[{"loc": [], "msg": str(error)}]
        ) from None
    except RecursionError:
        raise InvalidRequest(
            "the body is nested too deeply", errors=[{"loc": [], "msg": "too deep"}]
        ) from None


_JSON_ONLY = (
    "the body must be sent as JSON: Content-Type: application/json (or a +json type), in UTF-8"
)


def _is_json(declared_types: list[str]) -> bool:
    """Whether the one ``Content-Type`` sent is JSON (``application/json`` or a
    ``+json`` type) in UTF-8, the only encoding JSON has (RFC 8259)."""
    if len(declared_types) != 1:
        return False
    media_type, *parameters = (part.strip() for part in declared_types[0].split(";"))
    media_type = media_type.lower()
    if not (
        media_type == "application/json"
        or (media_type.startswith("application/") and media_type.endswith("+json"))
    ):
        return False
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() != "utf-8":
            return False
    return True


class _NotStrictJson(ValueError):
    """What Python's parser takes but JSON (RFC 8259) does not, or leaves ambiguous."""


def _not_json(constant: str) -> Any:
    raise _NotStrictJson(f"{constant} is not a JSON value")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise _NotStrictJson("a number too large for a double")
    return number


def _object_without_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Parsers disagree on which of two equal names wins; a proxy could check one value
    # and the gateway act on the other.
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise _NotStrictJson("an object names the same member twice")
    return dict(pairs)


def _model_body(model: type[BaseModel]) -> dict[str, Any]:
    return {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
        },
    }


def _create_task_body() -> dict[str, Any]:
    return {
        "required": True,
        "description": "A plan (`steps`) or an open task (`open`).",
        "content": {
            "application/json": {
                "schema": {
                    "oneOf": [
                        {"$ref": f"#/components/schemas/{model.__name__}"}
                        for model in (CreateTaskRequest, CreateOpenTaskRequest)
                    ]
                }
            }
        },
    }


def _tool_arguments_body(catalogue: Catalogue) -> dict[str, Any]:
    return {
        "required": True,
        "description": "The tool's arguments; each tool's schema is listed under its name.",
        "content": {
            "application/json": {
                "schema": {
                    "anyOf": [
                        {"$ref": f"#/components/schemas/{contract.input_model.__name__}"}
                        for contract in catalogue
                    ]
                }
            }
        },
    }


def _add_schema(schemas: dict[str, Any], model: type[BaseModel]) -> None:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, definition in schema.pop("$defs", {}).items():
        schemas.setdefault(name, definition)
    schemas[model.__name__] = schema


ToolCaller = Callable[[Request, str, HTTPAuthorizationCredentials | None], Awaitable[Response]]


def _named_tool_endpoint(tool: str, call: ToolCaller) -> Callable[..., Awaitable[Response]]:
    async def call_named_tool(
        request: Request,
        idempotency_key: IdempotencyKeyHeader = None,
        credentials: Credentials = None,
    ) -> Response:
        return await call(request, tool, credentials)

    return call_named_tool


def _task_step_schema(catalogue: Catalogue) -> dict[str, Any]:
    """A task step as one variant per tool, so ``arguments`` is documented per tool."""
    return {
        "title": "TaskStepRequest",
        "description": "One step of a task: a tool and its arguments.",
        "oneOf": [
            {
                "type": "object",
                "title": f"{contract.name} step",
                "properties": {
                    "step_id": {"type": "string", "pattern": NAME_PATTERN},
                    "tool": {"type": "string", "const": contract.name},
                    "arguments": {"$ref": f"#/components/schemas/{contract.input_model.__name__}"},
                },
                "required": ["step_id", "tool", "arguments"],
                "additionalProperties": False,
            }
            for contract in catalogue
        ],
    }


def _call_schema(catalogue: Catalogue) -> dict[str, Any]:
    """A call of an open task as one variant per tool, so ``arguments`` is documented per
    tool; the other fields as ``CallRequest`` documents them."""
    fields = CallRequest.model_json_schema()["properties"]
    return {
        "title": "CallRequest",
        "description": CallRequest.__doc__,
        "oneOf": [
            {
                "type": "object",
                "title": f"{contract.name} call",
                "properties": {
                    "call_id": fields["call_id"],
                    "tool": {"type": "string", "const": contract.name},
                    "arguments": {"$ref": f"#/components/schemas/{contract.input_model.__name__}"},
                    "deliberate_repeat": fields["deliberate_repeat"],
                },
                "required": ["tool", "arguments"],
                "additionalProperties": False,
            }
            for contract in catalogue
        ],
    }


def _describe_fields(schemas: dict[str, Any], model: type[BaseModel]) -> None:
    """Give the published schema of a model from elsewhere its fields' docstrings, as our
    own models get them from ``use_attribute_docstrings``."""
    for name in (model.__name__, f"{model.__name__}-Output", f"{model.__name__}-Input"):
        properties = schemas.get(name, {}).get("properties", {})
        for field_name, doc in _attribute_docs(model).items():
            if field_name in properties:
                properties[field_name].setdefault("description", doc)


def _attribute_docs(model: type[BaseModel]) -> dict[str, str]:
    """Each field declared in the class body with the string literal that follows it."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(model)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, following in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(following.value.value)
    return docs


def _require_idempotency_keys(document: dict[str, Any]) -> None:
    # Optional in the handler signature so that its absence is answered by the boundary
    # (problem idempotency-key-missing), but required by the contract. Decisions are the
    # exception: a key sent there is claimed like any other, but the task keeps one
    # decision per step, so a decision without one is still safe to repeat.
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            if "decisions" in operation.get("tags", []):
                continue
            for parameter in operation.get("parameters", []):
                if parameter.get("name") == "Idempotency-Key":
                    parameter["required"] = True
