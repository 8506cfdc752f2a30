"""One-step ``issue_coupon`` calls on the two production paths, each beside its bare
Temporal baseline, and what they leave in PostgreSQL: what ``task_overhead`` times one by
one and ``saturation`` launches on a schedule.

- ``WorkerPath``: ``execute_workflow`` of ``BareWorkflow`` vs ``TaskClient`` starting the
  one-step task the gateway starts (its idempotency record claimed beforehand, as the
  gateway claims it: ``prepare``, off the clock), awaiting it and writing its outcome
  into the record, as the gateway does.
- ``GatewayPath``: the bare FastAPI endpoint vs ``POST /v1/tools/issue_coupon/calls`` with
  a new ``Idempotency-Key``, waited to the end; both sent the same body and headers.

An operation that does not end as it should raises ``UnexpectedAnswer``.
"""

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import psycopg
from psycopg_pool import AsyncConnectionPool

from bench._bare import BareWorkflow
from bench._report import Arm
from bench._stack import TOOL, OneStepStack
from onceflow.gateway import TOOL_CALL_STEP_ID, Principal, request_fingerprint
from onceflow.idempotency import REQUEST_HASH_MEMO, IdempotencyStore, NewClaim, stored_outcome
from onceflow.task_api import TaskClient
from onceflow.tools.worker import derive_task_workflow_id
from onceflow.workflows.task_models import AgentTaskInput, StepInput, TaskState


class UnexpectedAnswer(AssertionError):
    """An operation ended otherwise than succeeded: ``status`` says how (an HTTP status, or
    the task's state)."""

    def __init__(self, status: str, detail: str) -> None:
        super().__init__(f"{status}: {detail[:300]}")
        self.status = status


@dataclass
class Operation:
    """One arm's way to run one operation, and what it needs prepared off the clock."""

    arm: Arm
    run: Callable[[Any], Awaitable[str]]
    """Runs one operation; returns the id of the workflow it ran."""
    prepare: Callable[[int], Awaitable[list[Any]]] | None = None
    last_workflow_id: str | None = None


def _coupon_body() -> dict[str, str]:
    return {"user_id": f"u-{uuid.uuid4().hex[:16]}", "coupon_id": "BENCH"}


@dataclass
class Claimed:
    """A tool call claimed as the gateway claims one, not yet started."""

    workflow_id: str
    fingerprint: str
    arguments: dict[str, str]


class WorkerPath:
    """Temporal's client API: ``execute_workflow`` vs ``TaskClient`` on the production
    worker, the task's idempotency record claimed beforehand."""

    def __init__(
        self,
        bare_client: Any,
        bare_queue: str,
        tasks: TaskClient,
        pool: AsyncConnectionPool,
        principal: Principal,
    ) -> None:
        self._bare_client = bare_client
        self._bare_queue = bare_queue
        self._tasks = tasks
        self._records = IdempotencyStore(pool)
        self._principal = principal
        self.baseline = Operation(Arm("bare workflow + no-op activity"), self._bare)
        self.candidate = Operation(
            Arm("onceflow one-step task, production worker"), self._task, self._claim
        )

    async def _bare(self, _: None) -> str:
        workflow_id = f"bare-{uuid.uuid4().hex}"
        await self._bare_client.execute_workflow(
            BareWorkflow.run, "x", id=workflow_id, task_queue=self._bare_queue
        )
        return workflow_id

    async def _claim(self, count: int) -> list[Claimed]:
        principal = self._principal
        scope = f"{principal.tenant}:{principal.name}:{TOOL}:call"
        claimed = []
        for _ in range(count):
            key, arguments = f"bench-{uuid.uuid4().hex}", _coupon_body()
            fingerprint = request_fingerprint(
                operation="tools.call",
                scope=scope,
                route=f"POST /v1/tools/{TOOL}/calls",
                body=arguments,
            )
            workflow_id = derive_task_workflow_id(
                tenant=principal.tenant, scope=scope, idempotency_key=key
            )
            await self._records.claim(
                NewClaim(
                    scope=scope,
                    idempotency_key=key,
                    request_hash=fingerprint,
                    tenant=principal.tenant,
                    principal_id=principal.principal_id,
                    workflow_id=workflow_id,
                    lease=timedelta(minutes=10),
                    result_retention=timedelta(days=1),
                    key_quota=10_000_000,
                    quota_window_seconds=60,
                )
            )
            claimed.append(Claimed(workflow_id, fingerprint, arguments))
        return claimed

    async def _task(self, claimed: Claimed) -> str:
        await self._tasks.start(
            AgentTaskInput(
                tenant=self._principal.tenant,
                principal=self._principal.name,
                steps=[
                    StepInput(step_id=TOOL_CALL_STEP_ID, tool=TOOL, arguments=claimed.arguments)
                ],
                record_outcome=True,
                starter_records_outcome=True,
            ),
            workflow_id=claimed.workflow_id,
            memo={REQUEST_HASH_MEMO: claimed.fingerprint},
        )
        status = await self._tasks.result(claimed.workflow_id)
        if status.state is not TaskState.SUCCEEDED:
            raise UnexpectedAnswer(f"task {status.state.value}", repr(status))
        # The starter writes the outcome, as the gateway does for the tasks it starts.
        state, status_code, body, resource_id = stored_outcome(status)
        written = await self._records.record_outcome(
            workflow_id=claimed.workflow_id,
            run_id=None,
            state=state,
            status_code=status_code,
            response_body=body,
            resource_id=resource_id,
        )
        if not written:
            raise UnexpectedAnswer("outcome not written", claimed.workflow_id)
        return claimed.workflow_id


class GatewayPath:
    """HTTP: the bare FastAPI endpoint vs ``POST /v1/tools/issue_coupon/calls``."""

    def __init__(self, http: httpx.AsyncClient, gateway: str, bare: str, api_key: str) -> None:
        self._http = http
        self._gateway = gateway
        self._bare_url = bare
        self._api_key = api_key
        self.baseline = Operation(Arm("bare workflow behind FastAPI"), self._bare)
        self.candidate = Operation(
            Arm(f"POST /v1/tools/{TOOL}/calls, waited to the end"), self._call
        )

    def _headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self._api_key}",
            "Idempotency-Key": f"bench-{uuid.uuid4().hex}",
        }

    async def _bare(self, _: None) -> str:
        answer = await self._http.post(
            f"{self._bare_url}/v1/bare/calls", json=_coupon_body(), headers=self._headers()
        )
        _check(answer)
        return str(answer.json()["workflow_id"])

    async def _call(self, _: None) -> str:
        answer = await self._http.post(
            f"{self._gateway}/v1/tools/{TOOL}/calls", json=_coupon_body(), headers=self._headers()
        )
        _check(answer)
        if answer.json()["state"] != "succeeded":
            raise UnexpectedAnswer(f"task {answer.json()['state']}", answer.text)
        return str(answer.json()["task_id"])


def one_step_paths(
    stack: OneStepStack, wanted: Sequence[str], http: httpx.AsyncClient | None
) -> dict[str, WorkerPath | GatewayPath]:
    """The paths named in ``wanted`` (``worker``, ``gateway``) on ``stack``; the gateway
    path sends its requests with ``http``."""
    paths: dict[str, WorkerPath | GatewayPath] = {}
    if "worker" in wanted:
        paths["worker"] = WorkerPath(
            stack.temporal.client, stack.bare_queue, stack.tasks, stack.pool, stack.principal
        )
    if "gateway" in wanted:
        assert http is not None and stack.gateway_url is not None and stack.bare_url is not None
        paths["gateway"] = GatewayPath(http, stack.gateway_url, stack.bare_url, stack.api_key)
    return paths


def _check(answer: httpx.Response) -> None:
    if answer.status_code != 200:
        raise UnexpectedAnswer(f"HTTP {answer.status_code}", answer.text)


def coupons_and_records(database_url: str) -> tuple[int, dict[str, int]]:
    """The business outcome so far: coupons issued, and idempotency records by state."""
    with psycopg.connect(database_url) as conn:
        states: dict[str, int] = dict(
            conn.execute(
                "SELECT state, count(*) FROM idempotency_records GROUP BY state"
            ).fetchall()
        )
        coupons = conn.execute("SELECT count(*) FROM coupon_issuances").fetchone()
    return (coupons[0] if coupons else 0), states
