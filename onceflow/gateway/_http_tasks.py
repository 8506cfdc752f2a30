"""The HTTP API's task routes: create a task (a plan or an open task), read its status,
send calls to an open task, and close it.
"""

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from onceflow.errors import TaskNotOpen
from onceflow.gateway._http_answers import (
    TASK_CALL_PROBLEMS,
    TASK_ENDED,
    TASK_GOING,
    TASK_READ_PROBLEMS,
    TOOL_CALL_PROBLEMS,
    answer_response,
)
from onceflow.gateway._http_json import SortedJSONResponse, read_json, sent_key
from onceflow.gateway._http_parameters import (
    BEARER,
    KEY_FORMS_DOC,
    KEY_HEADER_DOC,
    TaskId,
    api_key,
    key_header,
    service_of,
)
from onceflow.gateway._openapi import TASK_ANSWER_HEADERS, problem_answers
from onceflow.gateway._openapi_document import create_task_body, model_body
from onceflow.gateway._requests import CallRequest
from onceflow.gateway._responses import CallView
from onceflow.idempotency import TaskView
from onceflow.workflows.task_models import TaskStatus

router = APIRouter(tags=["tasks"])

_CREATE_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: TASK_ENDED,
    201: {
        "model": TaskView,
        "description": "An open task was created (`open: true`, no calls yet); `Location` "
        "is its status. The same key and body answer 201 with the same task while it is "
        "open (`Idempotent-Replayed: true`), and its stored final view (200, state "
        "`closed`) once it has closed.",
        "headers": TASK_ANSWER_HEADERS[201],
    },
    202: TASK_GOING,
    **problem_answers(TOOL_CALL_PROBLEMS),
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
    **problem_answers(TASK_CALL_PROBLEMS),
}

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
    f"{KEY_FORMS_DOC} Scoped to the principal (calls of any task)."
)


@router.post(
    "/v1/tasks",
    responses=_CREATE_ANSWERS,
    response_class=SortedJSONResponse,
    openapi_extra={
        **BEARER,
        "parameters": [key_header(KEY_HEADER_DOC)],
        "requestBody": create_task_body(),
    },
)
async def create_task(request: Request) -> Response:
    """Run tool calls in order as one task under one retry budget (a plan, `steps`),
    or create an open task (`open`) whose calls the agent sends one by one.

    An open task is answered 201 as soon as it runs; send its calls to
    `POST /v1/tasks/{id}/calls` and close it with `POST /v1/tasks/{id}/close` (it also
    closes after `idle_timeout` without calls, and at `max_lifetime`).
    """
    service = service_of(request)
    principal = await service.authenticate(api_key(request))
    key = sent_key(request)
    body = await read_json(request)
    return answer_response(await service.create_task(principal, body, key))


@router.get(
    "/v1/tasks/{task_id}",
    response_model=TaskStatus,
    responses=problem_answers(TASK_READ_PROBLEMS),
    openapi_extra=BEARER,
)
async def get_task(request: Request, task_id: TaskId) -> TaskStatus:
    """A task's full status: every step's arguments, attempts and evidence.

    For an open task (`open: true`), `steps` lists its calls in arrival order, repeats
    included (`repeat_of`, `deliberate_repeat`); `closing` says why it takes no more
    calls, `runs` how many workflow runs it took (it continues as new when long).
    """
    service = service_of(request)
    principal = await service.authenticate(api_key(request))
    return await service.task_status(principal, task_id)


@router.post(
    "/v1/tasks/{task_id}/calls",
    responses=_CALL_ANSWERS,
    response_class=SortedJSONResponse,
    openapi_extra={
        **BEARER,
        "parameters": [key_header(_CALL_KEY_HEADER_DOC)],
        "requestBody": model_body(CallRequest),
    },
)
async def call_in_task(
    request: Request,
    task_id: TaskId,
    wait: WaitParameter = "settled",
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
    service = service_of(request)
    principal = await service.authenticate(api_key(request))
    key = sent_key(request)
    body = await read_json(request)
    return answer_response(
        await service.call_in_task(principal, task_id, body, key, wait_until_ended=wait == "ended")
    )


@router.post(
    "/v1/tasks/{task_id}/close",
    response_model=TaskStatus,
    responses=problem_answers((*TASK_READ_PROBLEMS, TaskNotOpen)),
    response_class=SortedJSONResponse,
    openapi_extra=BEARER,
)
async def close_task(request: Request, task_id: TaskId) -> TaskStatus:
    """Close an open task: it takes no more calls (they are refused with the reason)
    and ends, state `closed`, once its unfinished calls end.

    Idempotent by itself, so it takes no Idempotency-Key: closing a closing or closed
    task answers with its status again. A plan answers 409 `task-not-open`.
    """
    service = service_of(request)
    principal = await service.authenticate(api_key(request))
    return await service.close_task(principal, task_id)
