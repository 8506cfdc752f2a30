"""The boundary's request flow, shared by the HTTP API, the MCP server and tests.

In the article's order: authenticate, authorize, validate (a failure reserves nothing),
fingerprint, claim ``(scope, key)`` (``_claims``), then act once per key by noun: task
starts (``_task_starts``: one-step calls, plans, open tasks), calls of open tasks
(``_call_requests``) and decisions (``_decision_requests``), each finding tasks through
the directory (``_task_directory``: status, the tenant and kind of tasks seen lately).
``BoundaryService`` is the one face the transports call: each of its methods is one
request of theirs.
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio.service import RPCError, RPCStatusCode

from onceflow.gateway._answer_cache import AnswerCache
from onceflow.gateway._backend import answers_within, backend_errors
from onceflow.gateway._call_requests import CallRequests
from onceflow.gateway._claims import Claims
from onceflow.gateway._decision_requests import DecisionRequests
from onceflow.gateway._principals import Principal, PrincipalStore
from onceflow.gateway._requests import (
    BoundaryAnswer,
    DecisionReply,
    allowed_tool,
    checked_key,
    request_scope,
)
from onceflow.gateway._responses import Readiness
from onceflow.gateway._settings import GatewaySettings
from onceflow.gateway._task_directory import TaskDirectory
from onceflow.gateway._task_handles import TaskHandles, TaskHandleStore
from onceflow.gateway._task_starts import TOOL_CALL_STEP_ID, TaskStarts
from onceflow.idempotency import IdempotencyStore
from onceflow.task_api import TaskClient
from onceflow.tools import ToolContract
from onceflow.tools.worker import CATALOGUE, Catalogue, derive_task_workflow_id
from onceflow.workflows.task_models import TaskStatus

__all__ = ["TOOL_CALL_STEP_ID", "BoundaryService"]

_READINESS_PROBE = ("onceflow-readiness-probe", "onceflow-readiness-probe")
"""What readiness reads: a scope and key no principal's scope can be, a task id no key
derives; none of them exists."""


class BoundaryService:
    """Authenticates, validates, fingerprints and claims; starts, waits and replays."""

    def __init__(
        self,
        *,
        principals: PrincipalStore,
        records: IdempotencyStore,
        tasks: TaskClient,
        settings: GatewaySettings,
        catalogue: Catalogue = CATALOGUE,
        after_claim: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``after_claim`` is a seam for tests only, awaited after a new claim and before
        its task starts (a test holds or kills the owner inside that window); no setting
        reaches it."""
        self._principals = principals
        self._records = records
        self._tasks = tasks
        self._settings = settings
        self._catalogue = catalogue
        # Forgotten with whatever the principal cache hears (a principal's change, a
        # prune pass); a service without that cache remembers no answer.
        self._answers = AnswerCache(settings.answer_cache_size, heard=principals.heard)
        claims = Claims(records, settings, self._answers)
        self._directory = TaskDirectory(tasks)
        self._task_starts = TaskStarts(
            claims=claims,
            records=records,
            tasks=tasks,
            settings=settings,
            catalogue=catalogue,
            directory=self._directory,
            after_claim=after_claim,
        )
        self._call_requests = CallRequests(
            claims=claims,
            records=records,
            tasks=tasks,
            directory=self._directory,
            settings=settings,
            catalogue=catalogue,
        )
        self._decision_requests = DecisionRequests(
            claims=claims, records=records, tasks=tasks, directory=self._directory
        )
        self.task_handles = TaskHandles(
            store=TaskHandleStore(records.pool),
            directory=self._directory,
            tasks=tasks,
            ttl=settings.result_retention,
        )
        """Handles of calls still waiting, for the MCP tasks extension."""

    @property
    def catalogue(self) -> Catalogue:
        """The tools this boundary serves."""
        return self._catalogue

    @property
    def principals(self) -> PrincipalStore:
        """The principals and their API keys (the codec endpoint authenticates with them)."""
        return self._principals

    @property
    def namespace(self) -> str:
        """The Temporal namespace this boundary's tasks live in."""
        return self._tasks.namespace

    async def authenticate(self, api_key: str | None) -> Principal:
        """The principal of an API key; raises ``Unauthenticated``."""
        async with backend_errors():
            return await self._principals.authenticate(api_key)

    async def readiness(self) -> Readiness:
        """Whether PostgreSQL and Temporal answer now (``GET /readyz``): both asked at
        once, each given ``readiness_timeout_seconds``; never raises."""
        timeout = self._settings.readiness_timeout_seconds
        database, temporal = await asyncio.gather(
            answers_within("PostgreSQL", self._records.get(*_READINESS_PROBE), timeout),
            answers_within("Temporal", self._temporal_answers(), timeout),
        )
        return Readiness(database=database, temporal=temporal)

    async def _temporal_answers(self) -> None:
        # Asks for a task no key derives (workflow ids are digests): the frontend and the
        # history service must both answer, as for every start, query and update.
        try:
            await self._tasks.status(_READINESS_PROBE[0])
        except RPCError as error:
            if error.status is not RPCStatusCode.NOT_FOUND:
                raise

    def call_workflow_id(self, principal: Principal, tool: str, idempotency_key: str) -> str:
        """The task a one-step call of ``tool`` under the key runs as (``call_tool``),
        whether or not it was started; its one step is ``TOOL_CALL_STEP_ID``. Raises
        what ``call_tool`` raises for a malformed key."""
        return derive_task_workflow_id(
            tenant=principal.tenant,
            scope=request_scope(principal, tool, "call"),
            idempotency_key=checked_key(idempotency_key),
        )

    def check_tool(self, principal: Principal, tool: str) -> None:
        """Raise ``UnknownToolRequested`` or ``ToolNotAllowed`` before a body is read."""
        allowed_tool(self._catalogue, principal, tool)

    # The transports' requests, by noun: tasks, calls of open tasks, decisions.

    async def call_tool(
        self,
        principal: Principal,
        tool: str,
        arguments: Any,
        idempotency_key: str | None,
        *,
        deliberate_repeat: bool = False,
        request_digest: str | None = None,
    ) -> BoundaryAnswer:
        """Run one tool call as a one-step task, at most once per key and fingerprint;
        ``deliberate_repeat``: a second effect identical to an earlier call's, on purpose
        (the tool's contract must allow it). ``request_digest``: the transport's digest
        of the request as sent (route and body bytes), vouched for when the request turns
        out to carry its key's remembered fingerprint (see ``repeated_tool_call``)."""
        return await self._task_starts.call_tool(
            principal,
            tool,
            arguments,
            idempotency_key,
            deliberate_repeat=deliberate_repeat,
            request_digest=request_digest,
        )

    def remembers_answers(self) -> bool:
        """Whether a repeat may be answered from memory now: the answer cache is on and
        the gateway hears of changes (otherwise ``repeated_tool_call`` answers nothing)."""
        return self._answers.generation() is not None

    def repeated_tool_call(
        self, principal: Principal, tool: str, idempotency_key: str, request_digest: str
    ) -> BoundaryAnswer | None:
        """The stored final answer of a tool call whose exact bytes (``request_digest``)
        were sent under this key before and checked in full then: a storm of repeats is
        answered from memory without parsing its body again. None: call ``call_tool``.
        Authenticate and ``check_tool`` first, as for any call."""
        return self._task_starts.repeated_tool_call(
            principal, tool, idempotency_key, request_digest
        )

    async def create_task(
        self, principal: Principal, body: Any, idempotency_key: str | None
    ) -> BoundaryAnswer:
        """Run a multi-step task, or create an open task (a body with ``open``), at most
        once per key and fingerprint."""
        return await self._task_starts.create_task(principal, body, idempotency_key)

    async def open_task(
        self, principal: Principal, body: Any, idempotency_key: str | None
    ) -> BoundaryAnswer:
        """Create an open task (``CreateOpenTaskRequest``), at most once per key and
        fingerprint; answered 201 as soon as it runs (the same key answers with the same
        task: 201 while it is open, its stored final view once it closed)."""
        return await self._task_starts.open_task(principal, body, idempotency_key)

    async def task_status(self, principal: Principal, task_id: str) -> TaskStatus:
        """A task of the principal's tenant; ``TaskNotFound`` for any other, and
        ``TaskUnanswered`` (saying why) when it exists but no worker answered for it."""
        return await self._directory.task_status(principal, task_id)

    def check_call(
        self, contract: ToolContract, arguments: Any, idempotency_key: str | None
    ) -> tuple[str, str]:
        """The well-formed key of a call whose arguments ``contract`` accepts, and the
        digest the task's repeat guard knows the call by: what a transport checks before
        it reserves or opens anything for the call.

        Raises:
            MissingIdempotencyKey, MalformedIdempotencyKey: The key is absent or malformed.
            InvalidRequest: The arguments are not the tool's.
        """
        return self._call_requests.check_call(contract, arguments, idempotency_key)

    async def task_of_call_key(self, principal: Principal, idempotency_key: str) -> str | None:
        """The open task the principal sent a call with this key to, if any: its call
        record keeps the task as its resource.

        Raises:
            BackendUnavailable: PostgreSQL does not answer.
        """
        return await self._call_requests.task_of_call_key(principal, idempotency_key)

    async def call_in_task(
        self,
        principal: Principal,
        task_id: str,
        body: Any,
        idempotency_key: str | None,
        *,
        wait_until_ended: bool = False,
    ) -> BoundaryAnswer:
        """Send one call (``CallRequest``) to an open task, at most once per key and
        fingerprint.

        Answers 200 with the call's ``CallView`` when it has ended, 202 when it parked,
        awaits approval or was still running when the bounded wait was over (or, with
        ``wait_until_ended``, had not ended by then). The same key and body answer again
        with the stored final answer, or, while the call has not ended, with its current
        state (asked of the task with the same call); both flagged ``replayed``.

        Raises:
            CallRefused: The task refused the call (closed or closing, budget or deadline
                spent, the call id names another call); stored as the key's answer.
            TaskNotOpen: The task is a plan; nothing was reserved.
            KeyReusedWithDifferentRequest: The key was used for another call or task.
        """
        return await self._call_requests.call_in_task(
            principal, task_id, body, idempotency_key, wait_until_ended=wait_until_ended
        )

    async def close_task(self, principal: Principal, task_id: str) -> TaskStatus:
        """Close an open task of the principal's tenant: it takes no more calls and ends
        once its unfinished calls end. Idempotent: closing a closing or closed task
        answers with its status.

        Raises:
            TaskNotOpen: The task is a plan.
        """
        return await self._call_requests.close_task(principal, task_id)

    async def approve(
        self, principal: Principal, task_id: str, body: Any, idempotency_key: str | None = None
    ) -> DecisionReply:
        """Approve or deny a step awaiting approval, as the calling principal (an approver
        or an operator).

        A repeat of the decision the step already got answers with that decision
        (``replayed``); another decision on a decided step, or any on an ended task,
        raises ``DecisionConflict``. ``idempotency_key`` is optional; when sent, the
        request is claimed like every other POST: the same key and body get the first
        answer again (a refusal included), the same key with another body or task
        raises ``KeyReusedWithDifferentRequest``.
        """
        return await self._decision_requests.approve(principal, task_id, body, idempotency_key)

    async def reconcile(
        self, principal: Principal, task_id: str, body: Any, idempotency_key: str | None = None
    ) -> DecisionReply:
        """Decide a parked step, as the calling principal, an operator (repeats and keys
        as for ``approve``)."""
        return await self._decision_requests.reconcile(principal, task_id, body, idempotency_key)
