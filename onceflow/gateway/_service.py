"""The boundary's request flow, shared by the HTTP API, the MCP server and tests.

In the article's order: authenticate, authorize, validate (a failure reserves nothing),
fingerprint, claim ``(scope, key)`` (``_claims``), then act once per key by noun: tasks
(``_task_requests``: one-step calls, plans, open tasks, status), calls of open tasks
(``_call_requests``) and decisions (``_decision_requests``). ``BoundaryService`` is the
one face the transports call.
"""

import asyncio
from collections.abc import Awaitable, Callable

from temporalio.service import RPCError, RPCStatusCode

from onceflow.gateway._backend import answers_within, backend_errors
from onceflow.gateway._call_requests import CallRequests
from onceflow.gateway._claims import Claims
from onceflow.gateway._decision_requests import DecisionRequests
from onceflow.gateway._principals import Principal, PrincipalStore
from onceflow.gateway._records import IdempotencyStore
from onceflow.gateway._requests import allowed_tool, checked_key, request_scope
from onceflow.gateway._responses import Readiness
from onceflow.gateway._settings import GatewaySettings
from onceflow.gateway._task_handles import TaskHandles, TaskHandleStore
from onceflow.gateway._task_requests import TOOL_CALL_STEP_ID, TaskRequests
from onceflow.task_api import TaskClient
from onceflow.tools.worker import CATALOGUE, Catalogue, derive_task_workflow_id

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
        claims = Claims(records, settings)
        self._task_requests = TaskRequests(
            claims=claims,
            records=records,
            tasks=tasks,
            settings=settings,
            catalogue=catalogue,
            after_claim=after_claim,
        )
        self._call_requests = CallRequests(
            claims=claims,
            records=records,
            tasks=tasks,
            task_requests=self._task_requests,
            settings=settings,
            catalogue=catalogue,
        )
        self._decision_requests = DecisionRequests(
            claims=claims, records=records, tasks=tasks, task_requests=self._task_requests
        )
        self.task_handles = TaskHandles(
            store=TaskHandleStore(records.pool),
            task_requests=self._task_requests,
            tasks=tasks,
            ttl=settings.result_retention,
        )
        """Handles of calls still waiting, for the MCP tasks extension."""
        # The transports' requests, by noun.
        self.call_tool = self._task_requests.call_tool
        self.create_task = self._task_requests.create_task
        self.open_task = self._task_requests.open_task
        self.task_status = self._task_requests.task_status
        self.check_call = self._call_requests.check_call
        self.task_of_call_key = self._call_requests.task_of_call_key
        self.call_in_task = self._call_requests.call_in_task
        self.close_task = self._call_requests.close_task
        self.approve = self._decision_requests.approve
        self.reconcile = self._decision_requests.reconcile

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
