"""The boundary over HTTP: a FastAPI app whose routes all call ``BoundaryService``.

Errors are RFC 9457 ``application/problem+json`` documents; a repeated request is
answered from its idempotency record with ``Idempotent-Replayed: true``. The OpenAPI
document is served at ``/openapi.json`` and rendered at ``/docs`` (Swagger UI) and
``/redoc``, both pages from assets the gateway serves itself, so they work offline.

Parsing is strict: a body is read only when it is sent as JSON (415 otherwise), its
values are validated without coercion (``_strict``), and ``Idempotency-Key`` is one
header with one key, bare or in the structured-field string form (``"abc"``, the IETF
draft's own form), both meaning the same key.

``build_app`` assembles the parts, each a module of its own: the routes by resource
(``_http_tools``, ``_http_tasks``, ``_http_decisions``, ``_http_operations``), the
middleware answering a tool call's vouched repeats before routing (``_http_repeats``), what they
take and answer (``_http_parameters``, ``_http_answers``), strict JSON (``_http_json``),
the error answers (``_http_errors``) and the OpenAPI document (``_openapi_document``,
``_openapi``).
"""

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI

from onceflow.encryption import PayloadEncryptionSettings
from onceflow.gateway._codec_endpoint import install_codec_endpoint
from onceflow.gateway._fingerprint import API_VERSION
from onceflow.gateway._http_decisions import router as decision_routes
from onceflow.gateway._http_errors import install_error_handlers, problem_response
from onceflow.gateway._http_operations import install_docs_pages
from onceflow.gateway._http_operations import router as operation_routes
from onceflow.gateway._http_parameters import service_of
from onceflow.gateway._http_repeats import VouchedRepeats
from onceflow.gateway._http_tasks import router as task_routes
from onceflow.gateway._http_tools import install_tool_routes
from onceflow.gateway._openapi_document import install_document
from onceflow.gateway._service import BoundaryService
from onceflow.tools.worker import CATALOGUE, Catalogue

__all__ = ["ServiceOpener", "build_app"]

ServiceOpener = Callable[[], AbstractAsyncContextManager[BoundaryService]]


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
        # Served by ``install_docs_pages`` from the gateway's own copies of their assets,
        # not from a CDN.
        docs_url=None,
        redoc_url=None,
        # The request's span only: spans per dependency and for the endpoint tell an
        # operator nothing the request's and onceflow's own do not, and FastAPI's log
        # records of validation failures would quote the request's values.
        telemetry={"operation_spans": False, "logs": False},
    )
    install_error_handlers(app)
    install_docs_pages(app)
    if encryption is not None and encryption.enabled:
        install_codec_endpoint(
            app,
            encryption,
            principals=lambda request: service_of(request).principals,
            namespace=lambda request: service_of(request).namespace,
            problem=problem_response,
        )
    # In this order, the order of the document's paths.
    app.include_router(operation_routes)
    install_tool_routes(app, catalogue)
    app.add_middleware(VouchedRepeats, tools=[contract.name for contract in catalogue])
    app.include_router(task_routes)
    app.include_router(decision_routes)
    install_document(app, catalogue)
    return app
