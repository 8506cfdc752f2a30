"""``OnceflowClient``: the gateway's HTTP API for Python agent runtimes (httpx).

It depends on nothing of onceflow's server side, so an agent runtime can install it
alone. Exception tree::

    OnceflowError                 any problem+json answer (``status``, ``problem_type``)
    ├── IdempotencyKeyReused      422: the key names a different earlier request
    └── RequestInProgress         409: another request with the key is starting the task
"""

import asyncio
import uuid
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import httpx

TERMINAL_STATES = frozenset({"succeeded", "failed"})
_PROBLEM = "urn:onceflow:problem:"


def new_idempotency_key() -> str:
    """A fresh high-entropy key for one logical call (no personal data in it)."""
    return f"ofc-{uuid.uuid4()}"


class OnceflowError(Exception):
    """The gateway refused a request; ``problem`` is its RFC 9457 document."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', '')}")
        self.status = status
        self.problem = problem

    @property
    def problem_type(self) -> str:
        """The problem's type slug, e.g. ``idempotency-key-reused``."""
        return str(self.problem.get("type", "")).removeprefix(_PROBLEM)


class IdempotencyKeyReused(OnceflowError):
    """The key was used before for a different request; use a new key."""


class RequestInProgress(OnceflowError):
    """Another request with this key is starting the task; retry with the same key."""

    @property
    def retry_after(self) -> float:
        """Seconds the gateway asked to wait."""
        return float(self.problem.get("retry_after_seconds", 1))


@dataclass(frozen=True)
class TaskResult:
    """A task as the gateway answered it."""

    task_id: str
    state: str
    body: dict[str, Any] = field(repr=False)
    status_code: int
    replayed: bool
    """True when the answer is the stored result of an earlier request with the key."""

    @property
    def done(self) -> bool:
        """Whether the task has ended (succeeded or failed)."""
        return self.state in TERMINAL_STATES

    @property
    def steps(self) -> list[dict[str, Any]]:
        """Each step's state, resource id and result."""
        steps: list[dict[str, Any]] = self.body.get("steps", [])
        return steps

    @property
    def result(self) -> dict[str, Any]:
        """The last step's result (the tool's result for a tool call)."""
        return self.steps[-1].get("result", {}) if self.steps else {}


class OnceflowClient:
    """Calls the gateway as one principal (its API key)."""

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
    ) -> TaskResult:
        """Call one tool; a lost response is retried with the same key, never a new one."""
        return await self._post_task(f"/v1/tools/{tool}/calls", arguments, idempotency_key, retries)

    async def start_task(
        self,
        steps: list[dict[str, Any]],
        *,
        idempotency_key: str,
        budget: dict[str, Any] | None = None,
        retries: int = 2,
    ) -> TaskResult:
        """Start a multi-step task (``steps``: ``step_id``, ``tool``, ``arguments``)."""
        body: dict[str, Any] = {"steps": steps}
        if budget is not None:
            body["budget"] = budget
        return await self._post_task("/v1/tasks", body, idempotency_key, retries)

    async def status(self, task_id: str) -> dict[str, Any]:
        """The task's full status (every step's arguments, attempts and evidence)."""
        response = await self._http.get(f"/v1/tasks/{task_id}")
        _raise_for_problem(response)
        status: dict[str, Any] = response.json()
        return status

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

    async def _post_task(
        self, path: str, body: dict[str, Any], idempotency_key: str, retries: int
    ) -> TaskResult:
        for attempt in range(retries + 1):
            try:
                response = await self._http.post(
                    path, json=body, headers={"Idempotency-Key": idempotency_key}
                )
            except httpx.TransportError:
                # The request may have reached the gateway: only the same key is safe.
                if attempt == retries:
                    raise
                await asyncio.sleep(0.5 * 2**attempt)
                continue
            try:
                _raise_for_problem(response)
            except RequestInProgress as busy:
                if attempt == retries:
                    raise
                await asyncio.sleep(busy.retry_after)
                continue
            answer: dict[str, Any] = response.json()
            return TaskResult(
                task_id=str(answer["task_id"]),
                state=str(answer["state"]),
                body=answer,
                status_code=response.status_code,
                replayed=response.headers.get("Idempotent-Replayed") == "true",
            )
        raise AssertionError("unreachable")


def _raise_for_problem(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        problem = response.json()
    except ValueError:
        problem = {"title": response.reason_phrase, "detail": response.text[:200]}
    if not isinstance(problem, dict):
        problem = {"detail": str(problem)[:200]}
    if "Retry-After" in response.headers:
        problem.setdefault("retry_after_seconds", response.headers["Retry-After"])
    kind = str(problem.get("type", "")).removeprefix(_PROBLEM)
    error_class: type[OnceflowError] = {
        "idempotency-key-reused": IdempotencyKeyReused,
        "request-in-progress": RequestInProgress,
    }.get(kind, OnceflowError)
    raise error_class(response.status_code, problem)
