"""What the OpenAPI document says about answers: each route's statuses, with the problem
types and the headers of each, as the gateway sends them.

A route lists the ``OnceflowError`` classes it may raise; ``problem_answers`` turns them
into one answer per status, whose ``application/problem+json`` schema names exactly
those classes' ``type`` URIs and whose headers are the ones ``http_api`` sets for them.
``finish_document`` then drops the 422 "Validation Error" FastAPI adds to every route
with parameters (the gateway answers 400 ``invalid-request`` for those) and publishes the
``Problem`` schema.
"""

import inspect
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict

from onceflow.errors import (
    ANSWERED_ERRORS,
    PROBLEM_BASE,
    CallRefused,
    DecisionConflict,
    DecisionRefused,
    OnceflowError,
    QuotaExceeded,
    RequestInProgress,
    Unauthenticated,
)

PROBLEM_JSON = "application/problem+json"
REPLAYED_HEADER = "Idempotent-Replayed"


class Problem(BaseModel):
    """An RFC 9457 problem document; never echoes a raw key or request body.

    Every error answer is one, ``type`` naming the failure mode; the members after
    ``detail`` are present only where that mode has them.
    """

    model_config = ConfigDict(use_attribute_docstrings=True)

    type: str
    """``urn:onceflow:problem:`` and the failure mode (see each answer's list)."""
    title: str
    status: int
    detail: str
    key_digest: str | None = None
    """Digest of the idempotency key concerned, for correlation with logs."""
    errors: list[dict[str, Any]] | None = None
    """With ``invalid-request``: where and what failed, without the offending values."""
    task_id: str | None = None
    """With ``call-refused`` and ``task-not-open``: the task."""
    reason: str | None = None
    """With ``call-refused``: why the task refused the call, in its own words."""
    task_state: str | None = None
    """With ``decision-conflict``: the task's state when the decision arrived."""
    step_state: str | None = None
    """With ``decision-conflict``: the step's state then."""
    decision: dict[str, Any] | None = None
    """With ``decision-conflict``: the step's earlier accepted decision, if any."""
    checks: dict[str, str] | None = None
    """With ``not-ready``: ``database`` and ``temporal``, each ``ok`` or ``unreachable``."""


def _header(description: str, schema: dict[str, Any], *, required: bool = False) -> Any:
    return {"description": description, "required": required, "schema": schema}


RETRY_AFTER = _header(
    "Seconds to wait before trying again (with the same Idempotency-Key and body).",
    {"type": "integer", "minimum": 1},
    required=True,
)
REPLAYED = _header(
    "`true` when this is the stored answer of an earlier request with the same "
    "Idempotency-Key (nothing was executed for this one); absent otherwise.",
    {"type": "string", "enum": ["true"]},
)
LOCATION = _header(
    "The task's status (`GET`), relative to the API root: poll it.",
    {"type": "string", "format": "uri-reference"},
    required=True,
)
CONTENT_LOCATION = _header(
    "The task's status (`GET`), relative to the API root.",
    {"type": "string", "format": "uri-reference"},
    required=True,
)
WWW_AUTHENTICATE = _header(
    'The scheme to authenticate with: `Bearer realm="onceflow"`.',
    {"type": "string"},
    required=True,
)

TASK_ANSWER_HEADERS: dict[int, dict[str, Any]] = {
    200: {"Content-Location": CONTENT_LOCATION, REPLAYED_HEADER: REPLAYED},
    201: {"Location": LOCATION, "Content-Location": CONTENT_LOCATION, REPLAYED_HEADER: REPLAYED},
    202: {
        "Location": LOCATION,
        "Content-Location": CONTENT_LOCATION,
        "Retry-After": RETRY_AFTER,
        REPLAYED_HEADER: REPLAYED,
    },
}
"""The headers of a task's or a call's answer (``_http_answers.answer_response``)."""
DECISION_ANSWER_HEADERS: dict[str, Any] = {REPLAYED_HEADER: REPLAYED}
"""The headers of an accepted decision's answer."""

_STORED_REFUSALS = (DecisionRefused, DecisionConflict, CallRefused)
"""Refusals a key's record keeps, answered again with ``Idempotent-Replayed: true``."""
_WAIT_AND_RETRY = (RequestInProgress, QuotaExceeded)
"""Refusals that carry a ``Retry-After`` (every 503 does too)."""


def problem_answers(kinds: Iterable[type[OnceflowError]]) -> dict[int | str, dict[str, Any]]:
    """The error answers of a route that may raise ``kinds``: one per status, with the
    problem types it carries and its headers."""
    by_status: dict[int, list[type[OnceflowError]]] = {}
    for kind in kinds:
        by_status.setdefault(kind.status, []).append(kind)
    answers: dict[int | str, dict[str, Any]] = {}
    for status, found in sorted(by_status.items()):
        answer: dict[str, Any] = {
            "description": "\n".join(f"- `{kind.code}`: {_first_line(kind)}" for kind in found),
            "content": {
                PROBLEM_JSON: {
                    "schema": {
                        "allOf": [{"$ref": "#/components/schemas/Problem"}],
                        "properties": {
                            "type": {"enum": [PROBLEM_BASE + kind.code for kind in found]}
                        },
                    },
                    "examples": {kind.code: _example(kind) for kind in found},
                }
            },
        }
        headers = _problem_headers(status, found)
        if headers:
            answer["headers"] = headers
        answers[status] = answer
    return answers


def _problem_headers(status: int, kinds: list[type[OnceflowError]]) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    if any(issubclass(kind, Unauthenticated) for kind in kinds):
        headers["WWW-Authenticate"] = WWW_AUTHENTICATE
    waits = [kind for kind in kinds if status == 503 or issubclass(kind, _WAIT_AND_RETRY)]
    if waits:
        retry_after = dict(RETRY_AFTER)
        if len(waits) < len(kinds):
            with_it = ", ".join(f"`{kind.code}`" for kind in waits)
            retry_after["required"] = False
            retry_after["description"] = f"With {with_it}: {RETRY_AFTER['description']}"
        headers["Retry-After"] = retry_after
    if any(issubclass(kind, _STORED_REFUSALS) for kind in kinds):
        headers[REPLAYED_HEADER] = REPLAYED
    return headers


def _example(kind: type[OnceflowError]) -> dict[str, Any]:
    return {
        "summary": kind.title,
        "value": {
            "type": PROBLEM_BASE + kind.code,
            "title": kind.title,
            "status": kind.status,
            "detail": _first_line(kind),
        },
    }


def _first_line(kind: type[OnceflowError]) -> str:
    """The first paragraph of the class's docstring, on one line."""
    paragraph = inspect.cleandoc(kind.__doc__ or kind.title).split("\n\n")[0]
    return " ".join(paragraph.split())


def finish_document(document: dict[str, Any]) -> None:
    """Drop FastAPI's 422 "Validation Error" answers (the gateway answers 400) and their
    schemas; publish ``Problem``."""
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            if responses.get("422", {}).get("description") == "Validation Error":
                del responses["422"]
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas["Problem"] = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas["Problem"]["properties"]["type"]["enum"] = sorted(
        PROBLEM_BASE + kind.code for kind in ANSWERED_ERRORS
    )


def durations_in_seconds(schemas: dict[str, Any], names: Iterable[str]) -> None:
    """Say, in the named request schemas and those they refer to, that a duration is an
    ISO 8601 string or a number of seconds, as the gateway takes it."""
    seen: set[str] = set()
    pending = list(names)
    while pending:
        name = pending.pop()
        if name in seen or name not in schemas:
            continue
        seen.add(name)
        pending.extend(_refs(schemas[name]))
        for prop in schemas[name].get("properties", {}).values():
            if prop.get("type") == "string" and prop.get("format") == "duration":
                del prop["type"], prop["format"]
                prop["anyOf"] = [
                    {"type": "string", "format": "duration"},
                    {"type": "number", "description": "seconds"},
                ]


def _refs(schema: Any) -> Iterable[str]:
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str):
                yield value.rsplit("/", 1)[-1]
            else:
                yield from _refs(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _refs(item)
