"""The HTTP API's operations routes: liveness (``/healthz``), readiness (``/readyz``), and
the documentation pages, ``/docs`` (Swagger UI) and ``/redoc``, from assets the gateway
serves itself. None of them needs an API key.
"""

from typing import Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from onceflow.errors import NotReady
from onceflow.gateway._http_parameters import service_of
from onceflow.gateway._openapi import problem_answers
from onceflow.gateway._responses import Readiness

DOCS_ASSETS = "/docs/assets"
"""Where the docs pages' JavaScript and CSS are served from (the ``fastapi-offline``
package's copies of Swagger UI and ReDoc)."""

router = APIRouter(tags=["operations"])


class Health(BaseModel):
    """Liveness of the gateway process."""

    status: str = Field(examples=["ok"])


class Ready(BaseModel):
    """Readiness: PostgreSQL and Temporal both answered."""

    status: Literal["ready"] = "ready"
    checks: dict[str, str] = Field(examples=[{"database": "ok", "temporal": "ok"}])
    """``database`` and ``temporal``, each ``ok``."""


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """Liveness: answers without touching PostgreSQL or Temporal (see `/readyz`)."""
    return Health(status="ok")


@router.get("/readyz", response_model=Ready, responses=problem_answers([NotReady]))
async def readyz(request: Request) -> Ready:
    """Readiness: 200 when PostgreSQL and Temporal both answer now, 503 (`not-ready`,
    with `Retry-After` and `checks` naming the one that does not) otherwise. Each is
    given `ONCEFLOW_GATEWAY_READINESS_TIMEOUT_SECONDS` (default 2 s); set the probe's
    own timeout longer. Needs no API key."""
    readiness = await service_of(request).readiness()
    if not readiness.ready:
        raise NotReady(_not_ready_detail(readiness), checks=readiness.checks())
    return Ready(checks=readiness.checks())


def _not_ready_detail(readiness: Readiness) -> str:
    down = [
        name
        for name, answered in (("PostgreSQL", readiness.database), ("Temporal", readiness.temporal))
        if not answered
    ]
    return f"{' and '.join(down)} {'is' if len(down) == 1 else 'are'} unreachable"


def install_docs_pages(app: FastAPI) -> None:
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
