"""``OnceflowClient``: the gateway's HTTP API for Python agent runtimes (httpx).

It depends on nothing of onceflow's server side, so an agent runtime can install it
alone. Its exceptions (``_errors``) are one class per status the gateway documents.

An open task (``OnceflowClient.open_task``) is one task for an agent's whole loop: each
``OpenTask.call`` is a step under the task's one retry budget, sent with a key of its own
that the client reuses for that call's retries, so a lost answer never makes a second call.

What the client retries by itself, always sending the same request under the same
``Idempotency-Key`` (so a retry never makes a second effect): a connection that failed or
dropped, a timeout, ``409 request-in-progress``, ``429`` and ``503``; at most ``retries``
times per request (default 2), waiting what ``Retry-After`` asks or else 0.5 s, 1 s,
2 s… (never more than ``LONGEST_RETRY_WAIT``: a longer ``Retry-After`` is raised at once,
for the caller to decide). Everything else is raised as it came.
"""

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from types import TracebackType
from typing import Any, Literal, Self

import httpx

from onceflow_client._errors import (
    BackendUnavailable,
    CallRefused,
    OnceflowError,
    RateLimited,
    RequestInProgress,
    problem_error,
)
from onceflow_client._results import (
    CallResult,
    TaskResult,
    call_ended,
    call_settled,
    new_idempotency_key,
)

__all__ = [
    # The exceptions lived here before ``_errors``: the adapters import them from here.
    "CallRefused",
    "CallResult",
    "OnceflowClient",
    "OnceflowError",
    "OpenTask",
    "RequestInProgress",
    "TaskResult",
    "new_idempotency_key",
]

RETRIED_ERRORS: tuple[type[OnceflowError], ...] = (
    RequestInProgress,
    RateLimited,
    BackendUnavailable,
)
"""Refusals the client sends again by itself (the same request, the same key): answers a
later retry may turn into a result."""
RETRIED_TRANSPORT_ERRORS: tuple[type[httpx.TransportError], ...] = (
    httpx.NetworkError,
    httpx.TimeoutException,
    httpx.RemoteProtocolError,
)
"""Failures after which the request may or may not have reached the gateway: only the
same key is safe to send again (connect, read and write errors and timeouts, a connection
closed mid-answer)."""
FIRST_BACKOFF = 0.5
"""Seconds before the first retry when the gateway gave no ``Retry-After``; doubled for
each retry after it. Default 0.5."""
LONGEST_RETRY_WAIT = 30.0
"""The longest wait before a retry, in seconds. A ``Retry-After`` asking for more is not
waited for: the refusal is raised with its ``retry_after``. Default 30."""
SETTLE_TIMEOUT = 60.0
"""Seconds an agent framework's tool call waits for onceflow to finish, park or ask for
approval before the run pauses with the call still going (both adapters' default)."""


class OpenTask:
    """An open task: call its tools one by one as the model picks them, then close it.

    Made by ``OnceflowClient.open_task`` (which closes it when its block ends) or
    ``OnceflowClient.create_open_task``.
    """

    def __init__(self, client: "OnceflowClient", created: TaskResult) -> None:
        self._client = client
        self.created = created
        """The gateway's answer to the task's creation."""

    @property
    def task_id(self) -> str:
        """The task's id (its workflow id)."""
        return self.created.task_id

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any] | None = None,
        *,
        call_id: str | None = None,
        deliberate_repeat: bool = False,
        wait: Literal["settled", "ended"] = "settled",
        timeout: float = 300.0,
        idempotency_key: str | None = None,
        retries: int = 2,
    ) -> CallResult:
        """Call one tool in the task; a new key is made for it unless one is given, and
        reused for each of its retries (lost answers, 503, 429, a request in progress).

        Args:
            tool: The tool's name.
            arguments: The tool's arguments.
            call_id: The call's id in the task (e.g. the model's tool-call id). Default:
                derived by the gateway from the key.
            deliberate_repeat: Run even when an earlier call of the task had the same
                tool and arguments (a second identical effect, on purpose). Default False:
                the task answers such a call with the earlier one (``repeat_of``).
            wait: ``settled`` (default) returns when the call ends, parks or awaits
                approval; ``ended`` returns only once it has ended (see ``wait``).
            timeout: Seconds to wait for the call to settle (or end) before
                ``TimeoutError``; the call goes on. Default 300.
            idempotency_key: The call's key, when the caller keeps its own (e.g. to
                resend a call after a restart); default a new one.
            retries: Retries of each request with the same key.

        Raises:
            CallRefused: The task refused the call, with its ``reason``.
            OnceflowError: The gateway refused the request (``status``, ``problem``).
        """
        body: dict[str, Any] = {
            "tool": tool,
            "arguments": dict(arguments or {}),
            "deliberate_repeat": deliberate_repeat,
        }
        if call_id is not None:
            body["call_id"] = call_id
        answer = await self._send(
            body, idempotency_key or new_idempotency_key(), wait=wait, retries=retries
        )
        if wait == "ended":
            return await self.wait(answer, timeout=timeout, retries=retries)
        # A gateway whose bounded wait ran out answered with the call still running:
        # ask again (same key) until it has settled.
        return await self._ask_until(
            answer, call_settled, "settled", timeout=timeout, poll_interval=1.0, retries=retries
        )

    async def wait(
        self,
        answer: CallResult,
        *,
        timeout: float = 300.0,
        poll_interval: float = 1.0,
        retries: int = 2,
    ) -> CallResult:
        """Ask again for a call until it has ended: a parked call or one awaiting
        approval ends with a person's decision. Each ask sends the same call with the
        same key (the gateway holds it open for a bounded time), so it never runs twice.

        Raises:
            TimeoutError: The call had not ended after ``timeout`` seconds.
        """
        return await self._ask_until(
            answer,
            call_ended,
            "ended",
            timeout=timeout,
            poll_interval=poll_interval,
            retries=retries,
        )

    async def _ask_until(
        self,
        answer: CallResult,
        done: Callable[[CallResult], bool],
        wait: Literal["settled", "ended"],
        *,
        timeout: float,
        poll_interval: float,
        retries: int,
    ) -> CallResult:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        current = answer
        while not done(current):
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"call {answer.step_id} is still {current.state}")
            asked_at = loop.time()
            current = await self._send(
                answer.request, answer.idempotency_key, wait=wait, retries=retries
            )
            if not done(current) and loop.time() - asked_at < poll_interval:
                # The gateway did not hold the request open: do not spin on it.
                await asyncio.sleep(min(poll_interval, max(deadline - loop.time(), 0)))
        return current

    async def status(self) -> dict[str, Any]:
        """The task's full status: every call in arrival order, repeats included."""
        return await self._client.status(self.task_id)

    async def close(self) -> dict[str, Any]:
        """Close the task: it takes no more calls and ends once its unfinished calls end.
        Safe to repeat; returns the task's status."""
        response = await self._client._post_keyed(
            f"/v1/tasks/{self.task_id}/close", None, None, retries=2
        )
        status: dict[str, Any] = response.json()
        return status

    async def _send(
        self,
        body: dict[str, Any],
        idempotency_key: str,
        *,
        wait: Literal["settled", "ended"],
        retries: int,
    ) -> CallResult:
        response = await self._client._post_keyed(
            f"/v1/tasks/{self.task_id}/calls",
            body,
            idempotency_key,
            retries=retries,
            params={"wait": wait} if wait != "settled" else None,
        )
        answer: dict[str, Any] = response.json()
        return CallResult(
            task_id=str(answer["task_id"]),
            step_id=str(answer["step_id"]),
            tool=str(answer["tool"]),
            state=str(answer["state"]),
            body=answer,
            status_code=response.status_code,
            replayed=response.headers.get("Idempotent-Replayed") == "true",
            idempotency_key=idempotency_key,
            request=body,
        )


class OnceflowClient:
    """Calls the gateway as one principal (its API key). Every public method is a
    coroutine to await, but ``open_task``, used as ``async with onceflow.open_task()``.

    Every method that takes ``retries`` sends its request again by itself, unchanged and
    under the same ``Idempotency-Key``, after a lost answer (a connection that failed or
    dropped, a timeout) and after ``409 request-in-progress``, ``429`` and ``503``: at
    most ``retries`` times (default 2, so three attempts), waiting what ``Retry-After``
    asks, or else 0.5 s, then 1 s, 2 s…; a ``Retry-After`` longer than
    ``LONGEST_RETRY_WAIT`` (30 s) is raised at once. httpx itself retries nothing. What is
    left is raised: an ``OnceflowError`` subclass for a refusal (its ``retry_after`` in
    seconds), the ``httpx.TransportError`` for a lost answer.

    Args:
        base_url: The gateway, e.g. ``http://127.0.0.1:8080``.
        api_key: The principal's API key (sent as ``Authorization: Bearer``).
        timeout: Seconds for each request (connect, read, write, pool). Default 30.
        transport: An httpx transport (tests, proxies). Default httpx's own.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        # httpx never retries a request by itself; retries here are explicit and keyed.
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
            transport=transport,
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        idempotency_key: str,
        retries: int = 2,
        deliberate_repeat: bool = False,
    ) -> TaskResult:
        """Call one tool as a one-step task; a lost response is retried with the same key,
        never a new one. A call of the same business intent as an earlier one (the tool's
        identifying arguments, under any key) is answered by that call
        (``result["repeat_of"]``), unless ``deliberate_repeat``.

        Args:
            tool: The tool's name.
            arguments: The tool's arguments.
            idempotency_key: One key per logical call: the same one for its retries.
            retries: Retries of the request with the same key (see the class). Default 2.
            deliberate_repeat: Make a second effect identical to an earlier call's on
                purpose (recorded). Default False.

        Raises:
            BadRequest: Invalid arguments, or an unusable key (``InvalidIdempotencyKey``).
            IdempotencyKeyReused: The key was used for another request.
            PermissionDenied: The principal may not call the tool.
            NotFound: No tool of that name.
            OnceflowError: Any other refusal (``status``, ``problem``, ``retry_after``).
        """
        path = f"/v1/tools/{tool}/calls" + ("?deliberate_repeat=true" if deliberate_repeat else "")
        return await self._post_task(path, arguments, idempotency_key, retries)

    async def start_task(
        self,
        steps: list[dict[str, Any]],
        *,
        idempotency_key: str,
        budget: dict[str, Any] | None = None,
        retries: int = 2,
    ) -> TaskResult:
        """Start a multi-step task (``steps``: ``step_id``, ``tool``, ``arguments``).

        Retries and raises as ``call_tool``.
        """
        body: dict[str, Any] = {"steps": steps}
        if budget is not None:
            body["budget"] = budget
        return await self._post_task("/v1/tasks", body, idempotency_key, retries)

    @asynccontextmanager
    async def open_task(
        self,
        *,
        budget: dict[str, Any] | None = None,
        idle_timeout: timedelta | float | str | None = None,
        max_lifetime: timedelta | float | str | None = None,
        idempotency_key: str | None = None,
        retries: int = 2,
    ) -> AsyncIterator[OpenTask]:
        """An open task for the block: ``async with onceflow.open_task() as task:``, then
        ``await task.call(tool, arguments)`` as the model picks tools. The task is closed
        when the block ends (it takes no more calls; calls still running finish).

        Args and raises: as ``create_open_task``.
        """
        task = await self.create_open_task(
            budget=budget,
            idle_timeout=idle_timeout,
            max_lifetime=max_lifetime,
            idempotency_key=idempotency_key,
            retries=retries,
        )
        try:
            yield task
        except BaseException:
            # Close anyway, without hiding why the block ended.
            try:
                await task.close()
            except (OnceflowError, httpx.HTTPError):
                pass
            raise
        await task.close()

    async def create_open_task(
        self,
        *,
        budget: dict[str, Any] | None = None,
        idle_timeout: timedelta | float | str | None = None,
        max_lifetime: timedelta | float | str | None = None,
        idempotency_key: str | None = None,
        retries: int = 2,
    ) -> OpenTask:
        """Create an open task; close it with ``OpenTask.close`` (or let it idle out).

        Args:
            budget: The task's one retry budget for all its calls (``RetryBudget``
                fields); default the gateway's.
            idle_timeout: The task closes after this long without a call (a
                ``timedelta``, seconds, or an ISO 8601 duration); default 30 minutes.
            max_lifetime: No call is accepted after this long; default 1 day.
            idempotency_key: The creation's key; default a new one (reused for its
                retries).
            retries: Retries with the same key (lost answers, 503, 429).
        """
        options: dict[str, Any] = {}
        if idle_timeout is not None:
            options["idle_timeout"] = _duration(idle_timeout)
        if max_lifetime is not None:
            options["max_lifetime"] = _duration(max_lifetime)
        body: dict[str, Any] = {"open": options}
        if budget is not None:
            body["budget"] = budget
        response = await self._post_keyed(
            "/v1/tasks", body, idempotency_key or new_idempotency_key(), retries=retries
        )
        return OpenTask(self, _task_result(response))

    async def list_tools(self, *, retries: int = 2) -> list[dict[str, Any]]:
        """The gateway's catalogue (``GET /v1/tools``): each tool's ``name``,
        ``description``, ``input_schema`` (JSON Schema), ``annotations`` (its effect
        contract as MCP hints), ``requires_approval`` and ``dedupe``.

        Args:
            retries: Retries after a lost answer or a 503 (see the class). Default 2.

        Raises:
            OnceflowError: The gateway refused the request (``status``, ``problem``).
        """
        response = await self._send("GET", "/v1/tools", retries=retries)
        tools: list[dict[str, Any]] = response.json()
        return tools

    async def status(self, task_id: str, *, retries: int = 2) -> dict[str, Any]:
        """The task's full status (every step's arguments, attempts and evidence).

        Args:
            task_id: The task's id.
            retries: Retries after a lost answer or a 503 (see the class). Default 2.

        Raises:
            NotFound: No task of that id for the principal's tenant.
            OnceflowError: The gateway refused the request (``status``, ``problem``).
        """
        response = await self._send("GET", f"/v1/tasks/{task_id}", retries=retries)
        status: dict[str, Any] = response.json()
        return status

    async def approve(
        self,
        task_id: str,
        step_id: str,
        *,
        approved: bool,
        reason: str,
        arguments_digest: str,
        retries: int = 2,
    ) -> dict[str, Any]:
        """Approve or deny a step awaiting approval, as this client's principal (an
        approver, ``onceflow principal add --approvals``, or an operator); the task records
        its name. ``await onceflow.approve(...)``. Sent without a key: the task keeps one
        decision per step, so a resend after a lost answer gets the same decision back.

        Args:
            task_id: The task's id.
            step_id: The step awaiting approval (a call's ``step_id``, or its ``repeat_of``).
            approved: True to let it run, False to deny it.
            reason: Why, in the person's words (recorded with the decision).
            arguments_digest: The digest of the arguments the person saw (a call's
                ``arguments_digest``): a decision about other arguments is refused.
            retries: Retries after a lost answer or a 503 (see the class). Default 2.

        Returns:
            The task's answer: ``step_id``, ``step_state``, ``message``; ``replayed`` with
            the earlier ``decision`` when the step had already been decided this way.

        Raises:
            PermissionDenied: The principal may not approve.
            DecisionConflict: The step was decided otherwise, or the task refused it.
            NotFound: No task of that id for the principal's tenant.
        """
        body = {
            "step_id": step_id,
            "approved": approved,
            "reason": reason,
            "arguments_digest": arguments_digest,
        }
        response = await self._post_keyed(
            f"/v1/tasks/{task_id}/approve", body, None, retries=retries
        )
        answer: dict[str, Any] = response.json()
        return answer

    async def wait(
        self, task: TaskResult, *, timeout: float = 300.0, poll_interval: float = 1.0
    ) -> TaskResult:
        """Poll until the task ends; raises ``TimeoutError`` after ``timeout`` seconds.

        A task awaiting approval or parked waits for a person: it ends only after a
        decision, so give such tasks a generous timeout or poll ``status`` yourself.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        current = task
        while not current.done:
            if loop.time() >= deadline:
                raise TimeoutError(f"task {task.task_id} is still {current.state}")
            await asyncio.sleep(poll_interval)
            status = await self.status(task.task_id)
            current = TaskResult(
                task_id=task.task_id,
                state=str(status["state"]),
                body=status,
                status_code=200,
                replayed=task.replayed,
            )
        return current

    async def _post_keyed(
        self,
        path: str,
        body: dict[str, Any] | None,
        idempotency_key: str | None,
        *,
        retries: int,
        params: dict[str, str] | None = None,
    ) -> httpx.Response:
        """POST under ``idempotency_key``, retried as the module says."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
        return await self._send(
            "POST", path, json=body, headers=headers, params=params, retries=retries
        )

    async def _send(
        self,
        method: str,
        path: str,
        *,
        retries: int,
        json: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
    ) -> httpx.Response:
        """One request, sent again unchanged (same key) after a lost answer or a refusal
        in ``RETRIED_ERRORS``, at most ``retries`` times; the last failure is raised."""
        for attempt in range(retries + 1):
            try:
                response = await self._http.request(
                    method, path, json=json, headers=headers, params=params
                )
            except RETRIED_TRANSPORT_ERRORS:
                # The request may have reached the gateway: only the same key is safe.
                if attempt == retries:
                    raise
                await asyncio.sleep(_backoff(attempt))
                continue
            error = problem_error(response)
            if error is None:
                return response
            wait = _retry_wait(error, attempt)
            if attempt == retries or wait is None:
                raise error
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    async def _post_task(
        self, path: str, body: dict[str, Any], idempotency_key: str, retries: int
    ) -> TaskResult:
        return _task_result(await self._post_keyed(path, body, idempotency_key, retries=retries))


def _task_result(response: httpx.Response) -> TaskResult:
    answer: dict[str, Any] = response.json()
    return TaskResult(
        task_id=str(answer["task_id"]),
        state=str(answer["state"]),
        body=answer,
        status_code=response.status_code,
        replayed=response.headers.get("Idempotent-Replayed") == "true",
    )


def _duration(value: timedelta | float | str) -> float | str:
    """A duration as the gateway reads it: seconds, or an ISO 8601 string as given."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value


def _backoff(attempt: int) -> float:
    return min(FIRST_BACKOFF * 2.0**attempt, LONGEST_RETRY_WAIT)


def _retry_wait(error: OnceflowError, attempt: int) -> float | None:
    """Seconds to wait before sending a refused request again; None: do not."""
    if not isinstance(error, RETRIED_ERRORS):
        return None
    if error.retry_after is None:
        return _backoff(attempt)
    return error.retry_after if error.retry_after <= LONGEST_RETRY_WAIT else None
