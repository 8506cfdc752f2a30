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

Errors are ``OnceflowError`` subclasses named after the gateway's problem types. A
network failure is safe to retry with the same key: ``call_tool(..., retries=n)`` does it.
"""

from onceflow_client._client import (
    CallRefused,
    CallResult,
    IdempotencyKeyReused,
    OnceflowClient,
    OnceflowError,
    OpenTask,
    RequestInProgress,
    TaskResult,
    new_idempotency_key,
)

__all__ = [
    "CallRefused",
    "CallResult",
    "IdempotencyKeyReused",
    "OnceflowClient",
    "OnceflowError",
    "OpenTask",
    "RequestInProgress",
    "TaskResult",
    "new_idempotency_key",
]
