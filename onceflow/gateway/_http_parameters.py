"""What the HTTP API's routes take besides their bodies: the caller's API key, the
``Idempotency-Key`` header as the OpenAPI document declares it, the task id, and the
``BoundaryService`` they all call.

Both headers are declared in the document only (``BEARER``, ``key_header``, in a route's
``openapi_extra``), not as parameters or dependencies of the handler, which reads them
itself (``api_key``, ``_http_json.sent_key``): FastAPI hands a handler only the first of
several key headers, and resolving them as parameters on every request cost a replayed
call more than validating its body.
"""

from typing import Annotated, Any

from fastapi import Path, Request

from onceflow.gateway._service import BoundaryService
from onceflow.tools.worker import IDEMPOTENCY_KEY_MAX_LENGTH, IDEMPOTENCY_KEY_PATTERN

_KEY_PATTERN = rf'^({IDEMPOTENCY_KEY_PATTERN}|"{IDEMPOTENCY_KEY_PATTERN}")$'
"""A key, bare or as a structured-field string (RFC 8941 sf-string), which the draft
``Idempotency-Key`` header (draft-ietf-httpapi-idempotency-key-header) defines it as."""

KEY_FORMS_DOC = (
    f"At most {IDEMPOTENCY_KEY_MAX_LENGTH} characters of A-Z a-z 0-9 . _ : - "
    "starting with a letter or digit, sent bare (`abc`) or as a structured-field string "
    '(`"abc"`, RFC 8941), which is the same key. One header line with one key: a repeated '
    "header or a list is refused (400 `idempotency-key-malformed`)."
)
"""The forms a key takes, as every key header's description says."""
KEY_HEADER_DOC = (
    "Identifies one logical attempt; send the same key with every retry of it. "
    f"{KEY_FORMS_DOC} "
    "Scoped to the principal and the tool (or task creation, or calls of open tasks)."
)
"""What the key header of a tool call or a task's creation says."""


def key_header(description: str, *, required: bool = True) -> dict[str, Any]:
    """The ``Idempotency-Key`` header as an OpenAPI parameter, for a route's
    ``openapi_extra``; ``required`` as the contract says, although the handler answers
    its absence itself (problem ``idempotency-key-missing``)."""
    return {
        "name": "Idempotency-Key",
        "in": "header",
        "required": required,
        "description": description,
        "schema": {
            "type": "string",
            "pattern": _KEY_PATTERN,
            "maxLength": IDEMPOTENCY_KEY_MAX_LENGTH + 2,
            "minLength": 1,
        },
    }


BEARER_SCHEME = {
    "HTTPBearer": {
        "type": "http",
        "description": "An API key from `onceflow principal add`.",
        "scheme": "bearer",
    }
}
"""How a caller authenticates: the document's ``securitySchemes``."""
BEARER: dict[str, Any] = {"security": [{"HTTPBearer": []}]}
"""In a route's ``openapi_extra``: the route takes the caller's API key (``api_key``)."""

TaskId = Annotated[str, Path(description="The task id (its workflow id).", max_length=1000)]


def service_of(request: Request) -> BoundaryService:
    """The service of the app the request came to (opened by its lifespan)."""
    service: BoundaryService = request.app.state.service
    return service


def api_key(request: Request) -> str | None:
    """The API key the request sent as its bearer token (``Authorization: Bearer <key>``,
    the scheme in any case); None without one."""
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    credentials = credentials.strip()
    return credentials if scheme.lower() == "bearer" and credentials else None
