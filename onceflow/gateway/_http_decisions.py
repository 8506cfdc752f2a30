"""The HTTP API's decision routes: a person approves or denies a step, or reconciles a
parked one.

A decision takes an ``Idempotency-Key`` but does not need one: the task keeps one
decision per step, so a repeat without a key is answered with the decision the step
already got (the document marks the key optional here, required everywhere else).
"""

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from onceflow.gateway._http_answers import DECISION_PROBLEMS, decision_response
from onceflow.gateway._http_json import SortedJSONResponse, read_json, sent_key
from onceflow.gateway._http_parameters import (
    BEARER,
    KEY_FORMS_DOC,
    TaskId,
    api_key,
    key_header,
    service_of,
)
from onceflow.gateway._openapi import DECISION_ANSWER_HEADERS, problem_answers
from onceflow.gateway._openapi_document import model_body
from onceflow.gateway._requests import ApproveRequest, ReconcileRequest
from onceflow.task_api import DecisionAnswer

router = APIRouter(tags=["decisions"])

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
    **problem_answers(DECISION_PROBLEMS),
}
_DECISION_KEY_HEADER_DOC = (
    "Optional on decisions; when sent, it works as on every other POST. Identifies one "
    "decision request: the same key and body answer again with the first answer (its "
    "status and body, a 409 refusal included, even after the task ended), flagged "
    "`Idempotent-Replayed: true`; the same key with another body, or for another task, "
    f"is refused (422). {KEY_FORMS_DOC} "
    "Scoped to the principal and the route (approve or "
    "reconcile). Without a key, the task still keeps one decision per step: a repeat of "
    "the decision the step already got answers with it, flagged the same way."
)
_DECISION_OPENAPI = {
    **BEARER,
    "parameters": [key_header(_DECISION_KEY_HEADER_DOC, required=False)],
}


@router.post(
    "/v1/tasks/{task_id}/approve",
    response_model=DecisionAnswer,
    responses=_DECISION_ANSWERS,
    response_class=SortedJSONResponse,
    openapi_extra={**_DECISION_OPENAPI, "requestBody": model_body(ApproveRequest)},
)
async def approve(request: Request, task_id: TaskId) -> Response:
    """Approve or deny a step's exact arguments (bound by their digest)."""
    service = service_of(request)
    principal = await service.authenticate(api_key(request))
    key = sent_key(request)
    body = await read_json(request)
    return decision_response(await service.approve(principal, task_id, body, key))


@router.post(
    "/v1/tasks/{task_id}/reconcile",
    response_model=DecisionAnswer,
    responses=_DECISION_ANSWERS,
    response_class=SortedJSONResponse,
    openapi_extra={**_DECISION_OPENAPI, "requestBody": model_body(ReconcileRequest)},
)
async def reconcile(request: Request, task_id: TaskId) -> Response:
    """Decide a parked step: happened (with resource_id), did_not_happen, or abandon."""
    service = service_of(request)
    principal = await service.authenticate(api_key(request))
    key = sent_key(request)
    body = await read_json(request)
    return decision_response(await service.reconcile(principal, task_id, body, key))
