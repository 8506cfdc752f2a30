"""What the HTTP API's routes answer: the service's answers as responses, and the
refusals each route may answer with, from which its documented error answers are built.

A task's or a call's answer carries its status URL (``Content-Location``, and
``Location`` while it goes on or once it is created) and ``Idempotent-Replayed: true``
when it is a key's stored answer; the headers are the ones ``_openapi`` documents.
"""

from typing import Any

from fastapi.responses import Response

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
)
from onceflow.gateway._http_json import SortedJSONResponse
from onceflow.gateway._openapi import REPLAYED_HEADER, TASK_ANSWER_HEADERS, problem_answers
from onceflow.gateway._requests import BoundaryAnswer, DecisionReply
from onceflow.idempotency import TaskView


def answer_response(answer: BoundaryAnswer) -> Response:
    """A task's or a call's answer, with its status URL."""
    headers = {"Content-Location": answer.status_url}
    if answer.replayed:
        headers[REPLAYED_HEADER] = "true"
    if answer.in_progress:
        headers["Location"] = answer.status_url
        headers["Retry-After"] = "1"
    if answer.created:
        headers["Location"] = answer.status_url
    return SortedJSONResponse(answer.body, status_code=answer.status_code, headers=headers)


def decision_response(reply: DecisionReply) -> Response:
    """An accepted decision's answer."""
    headers = {REPLAYED_HEADER: "true"} if reply.replayed else {}
    return SortedJSONResponse(reply.body, headers=headers)


# What each route may refuse with: its documented error answers are built from these.
AUTHENTICATED = (Unauthenticated, BackendUnavailable)
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
TOOL_CALL_PROBLEMS = (*AUTHENTICATED, ToolNotAllowed, UnknownToolRequested, *_KEYED_BODY)
NAMED_TOOL_CALL_PROBLEMS = tuple(
    kind for kind in TOOL_CALL_PROBLEMS if kind is not UnknownToolRequested
)
TASK_CALL_PROBLEMS = (
    *TOOL_CALL_PROBLEMS,
    TaskNotFound,
    CallRefused,
    TaskNotOpen,
    TaskBusy,
    TaskUnanswered,
)
DECISION_PROBLEMS = (
    *AUTHENTICATED,
    DecisionsNotAllowed,
    TaskNotFound,
    *(kind for kind in _KEYED_BODY if kind is not MissingIdempotencyKey),
    DecisionRefused,
    DecisionConflict,
    TaskBusy,
    TaskUnanswered,
)
TASK_READ_PROBLEMS = (*AUTHENTICATED, TaskNotFound, InvalidRequest, TaskUnanswered)

TASK_ENDED = {
    "model": TaskView,
    "description": "The task ended (succeeded or failed). With `Idempotent-Replayed: "
    "true` this is the stored answer of an earlier request with the same key.",
    "headers": TASK_ANSWER_HEADERS[200],
}
TASK_GOING = {
    "model": TaskView,
    "description": "The task is still running, awaiting approval or parked after the "
    "bounded wait; poll `Location`. Retrying with the same key is safe.",
    "headers": TASK_ANSWER_HEADERS[202],
}


def tool_call_answers(problems: tuple[type[OnceflowError], ...]) -> dict[int | str, Any]:
    """The answers of a route that runs a tool call as a one-step task."""
    return {200: TASK_ENDED, 202: TASK_GOING, **problem_answers(problems)}
