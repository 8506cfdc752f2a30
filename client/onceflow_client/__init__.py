"""A small client for agent runtimes: call tools and start tasks through the gateway.

::

    from onceflow_client import OnceflowClient, new_idempotency_key

    async with OnceflowClient("http://127.0.0.1:8080", api_key=API_KEY) as onceflow:
        key = new_idempotency_key()          # one per logical call; reuse it on retries
        task = await onceflow.call_tool("issue_coupon", {...}, idempotency_key=key)
        task = await onceflow.wait(task)     # polls until the task ends

An agent's loop is one open task: one workflow and one retry budget for all its calls,
keys handled by the client (a new one per call, the same one for that call's retries)::

    async with onceflow.open_task(idle_timeout=timedelta(minutes=30)) as task:
        answer = await task.call("charge_payment", {...})   # a CallResult
        if answer.repeat_of:                                  # the model repeated itself:
            ...                                               # nothing ran this time
        if answer.waiting_for_person:                         # parked / awaiting approval
            answer = await task.wait(answer)                  # until a person decides

The client sends a request again by itself, always under the same key, after a lost
answer, ``409 request-in-progress``, ``429`` and ``503`` (``retries`` times, default 2,
after ``Retry-After``). Refusals are ``OnceflowError`` subclasses, one per status the
gateway documents (``BadRequest``, ``Unauthenticated``, ``PermissionDenied``,
``NotFound``, ``Conflict``, ``IdempotencyKeyReused``, ``RateLimited``,
``BackendUnavailable``…), each with the problem document and a numeric ``retry_after``.
"""

from onceflow_client._client import (
    CallResult,
    OnceflowClient,
    OpenTask,
    TaskResult,
    new_idempotency_key,
)
from onceflow_client._errors import (
    BackendUnavailable,
    BadRequest,
    CallRefused,
    Conflict,
    DecisionConflict,
    IdempotencyKeyReused,
    InvalidIdempotencyKey,
    NotFound,
    OnceflowError,
    PermissionDenied,
    RateLimited,
    RequestInProgress,
    Unauthenticated,
)

__all__ = [
    "BackendUnavailable",
    "BadRequest",
    "CallRefused",
    "CallResult",
    "Conflict",
    "DecisionConflict",
    "IdempotencyKeyReused",
    "InvalidIdempotencyKey",
    "NotFound",
    "OnceflowClient",
    "OnceflowError",
    "OpenTask",
    "PermissionDenied",
    "RateLimited",
    "RequestInProgress",
    "TaskResult",
    "Unauthenticated",
    "new_idempotency_key",
]
