"""A small client for agent runtimes: call tools and start tasks through the gateway.

::

    from onceflow_client import OnceflowClient, new_idempotency_key

    async with OnceflowClient("http://127.0.0.1:8080", api_key=API_KEY) as onceflow:
        key = new_idempotency_key()          # one per logical call; reuse it on retries
        task = await onceflow.call_tool("issue_coupon", {...}, idempotency_key=key)
        task = await onceflow.wait(task)     # polls until the task ends

Errors are ``OnceflowError`` subclasses named after the gateway's problem types. A
network failure is safe to retry with the same key: ``call_tool(..., retries=n)`` does it.
"""

from onceflow_client._client import (
    IdempotencyKeyReused,
    OnceflowClient,
    OnceflowError,
    RequestInProgress,
    TaskResult,
    new_idempotency_key,
)

__all__ = [
    "IdempotencyKeyReused",
    "OnceflowClient",
    "OnceflowError",
    "RequestInProgress",
    "TaskResult",
    "new_idempotency_key",
]
