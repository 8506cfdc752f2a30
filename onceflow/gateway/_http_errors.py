"""How the HTTP API answers a failure: every error is an RFC 9457
``application/problem+json`` document.

A ``OnceflowError`` is answered with its own problem (``type`` naming the failure mode,
``Retry-After`` where waiting helps, ``WWW-Authenticate`` on 401, ``Idempotent-Replayed``
when a key's record answers it again); a request FastAPI cannot bind is ``400
invalid-request``; an unreachable PostgreSQL or Temporal that escaped the service's own
translation is the 503 it is; anything else is a 500 that quotes nothing of the request.
"""

import logging

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from psycopg_pool import PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from temporalio.service import RPCError

from onceflow.errors import (
    BackendUnavailable,
    InvalidRequest,
    OnceflowError,
    validation_problems,
)
from onceflow.gateway._backend import TEMPORAL_UNREACHABLE
from onceflow.gateway._http_json import SortedJSONResponse
from onceflow.gateway._openapi import PROBLEM_JSON, REPLAYED_HEADER

log = logging.getLogger("onceflow.gateway")

UNAVAILABLE_RETRY_AFTER_SECONDS = 2
"""``Retry-After`` of a 503 the service did not raise itself (see ``_as_backend_error``)."""


def problem_response(error: OnceflowError) -> Response:
    """``error`` as its problem document, with the headers its status calls for."""
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


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error ``app``'s routes raise as a problem document."""

    @app.exception_handler(OnceflowError)
    async def boundary_error(request: Request, error: OnceflowError) -> Response:
        if error.status >= 500 and not isinstance(error, BackendUnavailable):
            # A process's own failure (settings, a tool's registration), not a refusal.
            return _internal_error(request, error)
        return problem_response(error)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> Response:
        problems = validation_problems(error.errors())
        return problem_response(InvalidRequest("invalid request", errors=problems))

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
        return problem_response(unavailable)

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
