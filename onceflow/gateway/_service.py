"""The boundary's request flow, shared by the HTTP API, the MCP server and tests.

In the article's order: authenticate, authorize, validate (a failure reserves nothing),
fingerprint, claim ``(scope, key)``; then

* new claim → start the task workflow (id derived from scope and key, ``USE_EXISTING``)
  and wait a bounded time for its result; a start that cannot reach Temporal releases
  the claim, so a retry with the key starts (or joins) the task at once;
* same fingerprint, terminal → replay the stored status and body, flagged as a replay;
* same fingerprint, running → wait a bounded time, else answer in-progress (202 and the
  task's URL; 409 while the claim's owner has not started the task yet);
* different fingerprint → ``KeyReusedWithDifferentRequest``.

The workflow writes its own terminal result into the record (``record_task_outcome``),
so a replay works even when the gateway that started it died; if the record is still
processing when the workflow has closed, the workflow's result is used and stored.

An open task (``POST /v1/tasks`` with ``open``) is created the same way, but answered
as soon as it runs (201): it ends only when it is closed. Each call of it (``POST
/v1/tasks/{id}/calls``) is claimed like a decision: in the scope of its principal and
route, with the task id in its fingerprint, under a record that starts no workflow. The
claim's owner sends the call to the task (an Update, answered when the call ends, parks
or awaits approval) and stores the task's answer, a refusal included, as the key's result;
it releases the claim when the task service could not be reached. A call sent without a
call id gets one derived from its key, so a resend whose answer was lost is the same call
in the task too, which answers it by its id and never runs it twice. A stored answer that
is not final (the call had not ended) is not what a later request with the key gets: it
asks the task again with the same call and gets the call's current state, and the first
final answer replaces the stored one.

A decision (approve, reconcile) sent with a key is claimed the same way, in the scope
of its principal and route, with the task id in its fingerprint; the claim's owner sends
the decision and stores the task's answer (a refusal included) as the key's result, or
releases the claim when no answer came: the task keeps one decision per step, so a
resend is safe where restarting a task would not be. Without a key a decision goes
straight to the task, which answers a repeat with the decision it already took.
"""

import asyncio
import hashlib
import logging
import math
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import psycopg
from opentelemetry import trace
from opentelemetry.util.types import AttributeValue
from psycopg_pool import PoolTimeout
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowQueryFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError, RPCStatusCode

from onceflow.errors import (
    KEY_REUSED_DETAIL,
    BackendUnavailable,
    CallRefused,
    DecisionConflict,
    DecisionRefused,
    DecisionsNotAllowed,
    InvalidRequest,
    KeyReusedWithDifferentRequest,
    MissingIdempotencyKey,
    OnceflowError,
    RequestInProgress,
    TaskBusy,
    TaskNotFound,
    TaskNotOpen,
    TaskUnanswered,
    ToolNotAllowed,
    UnknownToolRequested,
    describe_validation,
    replayed_problem,
    validation_problems,
)
from onceflow.gateway._fingerprint import request_fingerprint
from onceflow.gateway._principals import ALL_TOOLS, Principal, PrincipalStore
from onceflow.gateway._records import (
    AlreadyClaimed,
    Claimed,
    IdempotencyRecord,
    IdempotencyStore,
    NewClaim,
    RecordState,
)
from onceflow.gateway._responses import (
    CREATED_STATUS_CODE,
    IN_PROGRESS_STATUS_CODE,
    CallView,
    Readiness,
    TaskView,
    call_status_code,
    call_view,
    is_terminal,
    stored_outcome,
    task_status_url,
    task_view,
)
from onceflow.gateway._settings import GatewaySettings
from onceflow.gateway._strict import validate_strictly
from onceflow.retry_policy import RetryBudget
from onceflow.task_api import DecisionAnswer, TaskClient
from onceflow.telemetry import boundary_span, sensitive_locations, unstorable_locations
from onceflow.tools import (
    CATALOGUE,
    Catalogue,
    ToolContract,
    UnknownTool,
    arguments_digest,
    check_idempotency_key,
    derive_task_workflow_id,
    key_digest,
)
from onceflow.workflows.task_models import (
    NAME_PATTERN,
    AgentTaskInput,
    ApproveInput,
    CallAnswer,
    CallInput,
    OpenTaskOptions,
    ReconcileDecision,
    ReconcileInput,
    StepInput,
    StepState,
    StepStatus,
    TaskState,
    TaskStatus,
)

log = logging.getLogger("onceflow.gateway")

REQUEST_HASH_MEMO = "onceflow_request_hash"
"""Workflow memo field holding the fingerprint of the request that started the task."""
STARTED_BY_CLAIM_MEMO = "onceflow_started_by_claim"
"""Workflow memo field naming the claim whose owner started the task (a digest of its
owner token): whether an answer is a replay depends on who started the task, not on
whether the task is still running when the gateway looks."""
TOOL_CALL_STEP_ID = "1"
"""Step id of the single step of a one-step task (a tool call)."""
_POLL_FIRST, _POLL_MAX = 0.02, 0.25
_Answer = TypeVar("_Answer")
"""What a keyed request answers: a task, a call or a decision."""
KNOWN_ANSWER_WAIT = 0.5
"""The least a call waits for its answer once the task has taken it: enough to read one
Temporal already returned with the call (the task refused it), no more."""
STATUS_QUERY_TIMEOUT = 12.0
"""Seconds a status query may take: longer than the workers' sticky timeout
(``onceflow.worker.STICKY_TIMEOUT``, 10 s), after which another worker answers for one that
crashed; a task whose workers are all down never answers."""
_TASK_KINDS_KEPT = 10_000
"""Tasks whose tenant and kind one boundary process remembers (see ``_task_kinds``)."""
_READINESS_PROBE = ("onceflow-readiness-probe", "onceflow-readiness-probe")
"""What readiness reads: a scope and key no principal's scope can be, a task id no key
derives; none of them exists."""


class TaskStepRequest(BaseModel):
    """One step of a task request: a tool and its arguments."""

    model_config = ConfigDict(extra="forbid")

    step_id: str = Field(pattern=NAME_PATTERN)
    """Stable id of the step within the task (its position or the agent's call id)."""
    tool: str = Field(pattern=NAME_PATTERN)
    arguments: dict[str, Any] = Field(default_factory=dict)
    """The tool's arguments, validated against the tool's input model."""


class CreateTaskRequest(BaseModel):
    """Body of ``POST /v1/tasks``: tool calls run in order under one retry budget."""

    model_config = ConfigDict(extra="forbid")

    steps: list[TaskStepRequest] = Field(min_length=1, max_length=50)
    budget: RetryBudget | None = None
    """The task's retry budget; omitted takes the defaults. Its longest retry window must
    be shorter than the gateway's result retention."""


_LONGEST_OPEN_TASK = timedelta(days=365)


class OpenTaskRequest(BaseModel):
    """How an open task lives: ``open`` in the body of ``POST /v1/tasks``."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    idle_timeout: timedelta = Field(
        default=timedelta(minutes=30), gt=timedelta(0), le=_LONGEST_OPEN_TASK
    )
    """The task closes after this long without a call while none is unfinished (ISO 8601
    duration such as ``PT30M``, or seconds). Default 30 minutes."""
    max_lifetime: timedelta = Field(
        default=timedelta(days=1), gt=timedelta(0), le=_LONGEST_OPEN_TASK
    )
    """No call is accepted after this long; the task closes once its calls end (ISO 8601
    duration such as ``P1D``, or seconds). Default 1 day."""


class CreateOpenTaskRequest(BaseModel):
    """Body of ``POST /v1/tasks`` for an open task: no steps; the agent sends its calls one
    by one (``POST /v1/tasks/{id}/calls``) under the task's one retry budget, then closes
    it (``POST /v1/tasks/{id}/close``). Its calls may use the tools the creating principal
    is allowed now."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    open: OpenTaskRequest
    """The open task's timeouts; ``{}`` takes the defaults."""
    budget: RetryBudget | None = None
    """The task's one retry budget for all its calls; omitted takes the defaults. Its
    longest retry window must be shorter than the gateway's result retention. In an open
    task only retries spend ``max_attempts_per_task``; its ``deadline`` counts the task's
    machine time from its creation."""


class CallRequest(BaseModel):
    """Body of ``POST /v1/tasks/{id}/calls``: one tool call of an open task."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    call_id: str | None = Field(default=None, pattern=NAME_PATTERN)
    """The call's step id in the task (e.g. the model's tool-call id). Omitted: derived
    from the Idempotency-Key, so a resend of the same request is the same call."""
    tool: str = Field(pattern=NAME_PATTERN)
    arguments: dict[str, Any] = Field(default_factory=dict)
    """The tool's arguments, validated against the tool's input model."""
    deliberate_repeat: bool = False
    """Run even when an earlier call of this task had the same tool and arguments (a
    second identical effect, on purpose; recorded in the task). Default false: such a
    call is answered by the earlier one (``repeat_of``) and never runs."""


class ApproveRequest(BaseModel):
    """Body of ``POST /v1/tasks/{id}/approve``; the approver is the calling principal."""

    model_config = ConfigDict(extra="forbid")

    step_id: str = Field(pattern=NAME_PATTERN)
    approved: bool
    reason: str = Field(min_length=1, max_length=2000)
    arguments_digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    """The ``arguments_digest`` of the step as read from ``GET /v1/tasks/{id}``."""


class ReconcileRequest(BaseModel):
    """Body of ``POST /v1/tasks/{id}/reconcile``; the operator is the calling principal."""

    model_config = ConfigDict(extra="forbid")

    step_id: str = Field(pattern=NAME_PATTERN)
    decision: ReconcileDecision
    reason: str = Field(min_length=1, max_length=2000)
    resource_id: str | None = Field(default=None, min_length=1, max_length=255)
    unverified: bool = False
    """With ``happened``: accept ``resource_id`` although the tool's look-up cannot
    confirm it; with ``did_not_happen``: although its miss does not prove the effect
    absent (recorded as unverified). Default False."""


@dataclass(frozen=True)
class BoundaryAnswer:
    """The boundary's answer to a task or tool-call request."""

    status_code: int
    """200 for an ended task or call (stored and replayable), 202 while it is still going,
    201 for an open task that was created (or is still open, on a replay)."""
    body: dict[str, Any] = field(repr=False)
    """A ``TaskView`` (a task) or a ``CallView`` (a call of an open task) as JSON data."""
    task_id: str
    replayed: bool
    """Whether this request was answered from an earlier request's execution."""

    @property
    def in_progress(self) -> bool:
        """Whether the task (or the call) had not ended when the bounded wait was over."""
        return self.status_code == IN_PROGRESS_STATUS_CODE

    @property
    def created(self) -> bool:
        """Whether this answers the creation of an open task that is still open."""
        return self.status_code == CREATED_STATUS_CODE

    @property
    def status_url(self) -> str:
        """Where to poll the task."""
        return task_status_url(self.task_id)


@dataclass(frozen=True)
class DecisionReply:
    """The boundary's answer to an approve or reconcile request the task accepted.

    A refusal is raised instead (``DecisionRefused``, ``DecisionConflict``), flagged
    ``replayed`` when it is the stored refusal of an earlier request with the same key.
    """

    body: dict[str, Any] = field(repr=False)
    """A ``DecisionAnswer`` as JSON data: the task's answer, or with a key the stored
    answer of the key's first request, byte for byte."""
    replayed: bool
    """Whether nothing new was decided for this request: the step already had this
    decision (the body's ``replayed``), or the key's stored answer was replayed."""

    @property
    def answer(self) -> DecisionAnswer:
        """The body as a ``DecisionAnswer``."""
        return DecisionAnswer.model_validate(self.body)


@dataclass(frozen=True)
class _Submission:
    principal: Principal
    scope: str
    idempotency_key: str = field(repr=False)
    fingerprint: str
    task: AgentTaskInput = field(repr=False)


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
        self._after_claim = after_claim
        self._task_kinds: OrderedDict[str, tuple[str, bool]] = OrderedDict()
        """Tenant and open-ness of tasks seen lately, by task id: both are fixed for the
        task's life, and a task id is never reused, so they need asking only once."""

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
        async with _backend_errors():
            return await self._principals.authenticate(api_key)

    async def readiness(self) -> Readiness:
        """Whether PostgreSQL and Temporal answer now (``GET /readyz``): both asked at
        once, each given ``readiness_timeout_seconds``; never raises."""
        timeout = self._settings.readiness_timeout_seconds
        database, temporal = await asyncio.gather(
            _answers("PostgreSQL", self._records.get(*_READINESS_PROBE), timeout),
            _answers("Temporal", self._temporal_answers(), timeout),
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

    # ── tasks and tool calls ─────────────────────────────────────────────────────────

    async def call_tool(
        self, principal: Principal, tool: str, arguments: Any, idempotency_key: str | None
    ) -> BoundaryAnswer:
        """Run one tool call as a one-step task, at most once per key and fingerprint."""
        # Only a catalogue name goes into the span: the path segment is the caller's text.
        known = tool if tool in self._catalogue else "unknown"
        attributes = _request_attributes(
            principal, _scope(principal, known, "call"), idempotency_key
        )
        with boundary_span(f"tools.call {known}", {**attributes, "onceflow.tool": known}):
            return _annotated(await self._call_tool(principal, tool, arguments, idempotency_key))

    async def _call_tool(
        self, principal: Principal, tool: str, arguments: Any, idempotency_key: str | None
    ) -> BoundaryAnswer:
        contract = self._allowed_tool(principal, tool)
        key = _checked_key(idempotency_key)
        if not isinstance(arguments, dict):
            raise InvalidRequest(
                "the body must be a JSON object of the tool's arguments",
                errors=[{"loc": [], "msg": "Input should be an object"}],
            )
        normalized = _validated_arguments(contract.input_model, arguments, location=())
        scope = _scope(principal, tool, "call")
        submission = _Submission(
            principal=principal,
            scope=scope,
            idempotency_key=key,
            fingerprint=request_fingerprint(
                operation="tools.call",
                scope=scope,
                route=f"POST /v1/tools/{tool}/calls",
                body=normalized,
            ),
            task=AgentTaskInput(
                tenant=principal.tenant,
                principal=principal.name,
                steps=[StepInput(step_id=TOOL_CALL_STEP_ID, tool=tool, arguments=normalized)],
                record_outcome=True,
            ),
        )
        return await self._submit(submission)

    async def create_task(
        self, principal: Principal, body: Any, idempotency_key: str | None
    ) -> BoundaryAnswer:
        """Run a multi-step task, or create an open task (a body with ``open``), at most
        once per key and fingerprint."""
        if isinstance(body, dict) and "open" in body:
            return await self.open_task(principal, body, idempotency_key)
        attributes = _request_attributes(
            principal, _scope(principal, "task", "create"), idempotency_key
        )
        with boundary_span("tasks.create", attributes):
            return _annotated(await self._create_task(principal, body, idempotency_key))

    async def open_task(
        self, principal: Principal, body: Any, idempotency_key: str | None
    ) -> BoundaryAnswer:
        """Create an open task (``CreateOpenTaskRequest``), at most once per key and
        fingerprint; answered 201 as soon as it runs (the same key answers with the same
        task: 201 while it is open, its stored final view once it closed)."""
        attributes = _request_attributes(
            principal, _scope(principal, "task", "create"), idempotency_key
        )
        with boundary_span("tasks.open", attributes):
            return _annotated(await self._open_task(principal, body, idempotency_key))

    async def _open_task(
        self, principal: Principal, body: Any, idempotency_key: str | None
    ) -> BoundaryAnswer:
        request = _parsed(CreateOpenTaskRequest, body)
        key = _checked_key(idempotency_key)
        self._check_budget(request.budget)
        # The principal's tools as they are now: the task keeps them for its whole life,
        # and each call is also checked against the caller's tools when it arrives.
        allowed = None if ALL_TOOLS in principal.allowed_tools else sorted(principal.allowed_tools)
        normalized = {
            "open": request.open.model_dump(mode="json"),
            "budget": request.budget.model_dump(mode="json") if request.budget else None,
        }
        task = AgentTaskInput(
            tenant=principal.tenant,
            principal=principal.name,
            budget=request.budget,
            open=OpenTaskOptions(
                idle_timeout=request.open.idle_timeout,
                max_lifetime=request.open.max_lifetime,
                allowed_tools=allowed,
            ),
            record_outcome=True,
        )
        return await self._submit(_task_submission(principal, key, normalized, task))

    async def _create_task(
        self, principal: Principal, body: Any, idempotency_key: str | None
    ) -> BoundaryAnswer:
        request: CreateTaskRequest = _parsed(CreateTaskRequest, body)
        contracts = [self._allowed_tool(principal, step.tool) for step in request.steps]
        trace.get_current_span().set_attribute(
            "onceflow.tools", [step.tool for step in request.steps]
        )
        key = _checked_key(idempotency_key)
        if len({step.step_id for step in request.steps}) != len(request.steps):
            raise InvalidRequest(
                "step ids must be unique within a task",
                errors=[{"loc": ["steps"], "msg": "step ids must be unique within a task"}],
            )
        steps = [
            StepInput(
                step_id=step.step_id,
                tool=step.tool,
                arguments=_validated_arguments(
                    contract.input_model, step.arguments, location=("steps", index, "arguments")
                ),
            )
            for index, (step, contract) in enumerate(zip(request.steps, contracts, strict=True))
        ]
        self._check_budget(request.budget)
        normalized = {
            "steps": [step.model_dump(mode="json") for step in steps],
            "budget": request.budget.model_dump(mode="json") if request.budget else None,
        }
        task = AgentTaskInput(
            tenant=principal.tenant,
            principal=principal.name,
            steps=steps,
            budget=request.budget,
            record_outcome=True,
        )
        return await self._submit(_task_submission(principal, key, normalized, task))

    async def task_status(self, principal: Principal, task_id: str) -> TaskStatus:
        """A task of the principal's tenant; ``TaskNotFound`` for any other."""
        if len(task_id) > 1000:
            raise TaskNotFound("no such task")
        async with _backend_errors():
            try:
                status = await asyncio.wait_for(self._tasks.status(task_id), STATUS_QUERY_TIMEOUT)
            except TimeoutError:
                raise await self._unanswered(task_id, tenant=principal.tenant) from None
            except RPCError as error:
                if error.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
                    raise TaskNotFound("no such task") from None
                raise
            except WorkflowQueryFailedError as failed:
                raise await self._unanswered(
                    task_id, tenant=principal.tenant, failure=str(failed)
                ) from None
        # Another tenant's task is reported exactly like a missing one.
        if status.tenant != principal.tenant:
            raise TaskNotFound("no such task")
        return status

    async def _unanswered(
        self, task_id: str, *, tenant: str | None = None, failure: str | None = None
    ) -> TaskNotFound | TaskUnanswered:
        """Why a task did not answer, from what Temporal holds without a worker: no such
        task (404, or another tenant's), its workflow task failing, no worker polling its
        queue, or a worker too slow to answer in time."""
        summary = await self._tasks.summary(task_id)
        if summary is None or (tenant is not None and summary.tenant != tenant):
            return TaskNotFound("no such task")
        exists = f"task {task_id} exists ({summary.state}) but"
        if failure is not None:
            return TaskUnanswered(
                f"{exists} its status query failed: {failure} (its workflow task fails: "
                "see the task in the Temporal UI)"
            )
        if await self._tasks.workers_polling() == 0:
            return TaskUnanswered(
                f"{exists} no worker polls its task queue: start one (onceflow worker)",
                retry_after_seconds=5,
            )
        return TaskUnanswered(
            f"{exists} did not answer its status query within {STATUS_QUERY_TIMEOUT:g} s, "
            "although workers polled its task queue lately (one may have just stopped, "
            "or be too busy)"
        )

    # ── calls of open tasks ─────────────────────────────────────────────────────────

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
        key = _checked_key(idempotency_key)
        normalized = _validated_arguments(contract.input_model, arguments, location=("arguments",))
        return key, arguments_digest(contract.name, normalized)

    async def task_of_call_key(self, principal: Principal, idempotency_key: str) -> str | None:
        """The open task the principal sent a call with this key to, if any: its call
        record keeps the task as its resource.

        Raises:
            BackendUnavailable: PostgreSQL does not answer.
        """
        async with _backend_errors():
            record = await self._records.get(_scope(principal, "task", "call"), idempotency_key)
        return record.resource_id if record is not None else None

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
        attributes = _request_attributes(
            principal, _scope(principal, "task", "call"), idempotency_key
        )
        attributes["onceflow.workflow_id"] = task_id[:1000]
        with boundary_span("tasks.call", attributes):
            return _annotated(
                await self._call_in_task(
                    principal, task_id, body, idempotency_key, wait_until_ended
                )
            )

    async def _call_in_task(
        self,
        principal: Principal,
        task_id: str,
        body: Any,
        idempotency_key: str | None,
        wait_until_ended: bool,
    ) -> BoundaryAnswer:
        request = _parsed(CallRequest, body)
        contract = self._allowed_tool(principal, request.tool)
        trace.get_current_span().set_attribute("onceflow.tool", request.tool)
        key = _checked_key(idempotency_key)
        arguments = _validated_arguments(
            contract.input_model, request.arguments, location=("arguments",)
        )
        scope = _scope(principal, "task", "call")
        call = CallInput(
            call_id=request.call_id or derive_call_id(scope, key),
            tool=request.tool,
            arguments=arguments,
            deliberate_repeat=request.deliberate_repeat,
            wait_until_ended=wait_until_ended,
        )
        # How long to wait for the answer is not part of what the call does: the same
        # call sent again with ``?wait=ended`` is the same request.
        normalized = call.model_dump(mode="json", exclude={"wait_until_ended"})
        claim = self._new_claim(
            principal,
            scope=scope,
            idempotency_key=key,
            fingerprint=request_fingerprint(
                operation="tasks.call",
                scope=scope,
                route=f"POST /v1/tasks/{task_id}/calls",
                body=normalized,
            ),
            # The record's own identity: no workflow is ever started under it.
            workflow_id=derive_task_workflow_id(
                tenant=principal.tenant, scope=scope, idempotency_key=key
            ),
        )
        # Only an open task of the principal's tenant takes calls; any other task reserves
        # nothing. A key used before is answered from its record even when the task
        # cannot be asked (no worker answers), so the task is asked only for a new key.
        earlier = None
        if task_id in self._task_kinds:
            self._check_open_task(principal, task_id)
        else:
            async with _backend_errors():
                earlier = await self._records.get(scope, key)
            if earlier is None:
                status = await self.task_status(principal, task_id)
                self._remember_task(task_id, tenant=status.tenant, is_open=status.open)
                self._check_open_task(principal, task_id)
        return await self._claim_call(claim, task_id, call, earlier)

    def _remember_task(self, task_id: str, *, tenant: str, is_open: bool) -> None:
        self._task_kinds[task_id] = (tenant, is_open)
        self._task_kinds.move_to_end(task_id)
        while len(self._task_kinds) > _TASK_KINDS_KEPT:
            self._task_kinds.popitem(last=False)

    def _check_open_task(self, principal: Principal, task_id: str) -> None:
        tenant, is_open = self._task_kinds[task_id]
        if tenant != principal.tenant:
            # Another tenant's task is reported exactly like a missing one.
            raise TaskNotFound("no such task")
        if not is_open:
            raise TaskNotOpen(
                "this task is a plan: its steps were given when it started; "
                "create an open task (POST /v1/tasks with open) to send calls",
                task_id=task_id,
            )

    async def _claim_call(
        self,
        claim: NewClaim,
        task_id: str,
        call: CallInput,
        earlier: IdempotencyRecord | None,
    ) -> BoundaryAnswer:
        deadline = self._reply_deadline()

        def retry_after(record: IdempotencyRecord) -> float:
            # The owner answers within its own bounded wait, unless it died: then the
            # lease's end is when a retry may take the claim over.
            owner_answers_in = (
                self._settings.replay_wait_seconds
                + STATUS_QUERY_TIMEOUT
                - (record.read_at - record.created_at).total_seconds()
            )
            return min(record.lease_left.total_seconds(), owner_answers_in)

        return await self._settle_claim(
            claim,
            target=task_id,
            doing="sending this call",
            deadline=deadline,
            earlier=earlier,
            owned=lambda record: self._call_claimed(record, task_id, call, deadline),
            finished=lambda record: self._replayed_call(record, task_id, call, deadline),
            retry_after=retry_after,
        )

    async def _call_claimed(
        self, record: IdempotencyRecord, task_id: str, call: CallInput, deadline: float
    ) -> BoundaryAnswer:
        try:
            view = await self._ask_task(task_id, call, deadline)
        except CallRefused as refused:
            # The task's own, definitive answer: the key keeps it. It recorded nothing,
            # so a corrected call under a new key is not blocked by it.
            await self._complete_call(record, task_id, refused)
            raise
        except Exception:
            # No answer came (the task service or the database failed). The claim may
            # go: the call was sent under its call id, so a retry with the key sends the
            # same call again and the task answers it by that id, never running it twice.
            await self._release_claim(record)
            raise
        answer = BoundaryAnswer(
            status_code=call_status_code(view),
            body=view.model_dump(mode="json"),
            task_id=task_id,
            replayed=False,
        )
        await self._complete_call(record, task_id, answer)
        return answer

    async def _replayed_call(
        self, record: IdempotencyRecord, task_id: str, call: CallInput, deadline: float
    ) -> BoundaryAnswer:
        """The key's stored answer when it is final; else the call's state now."""
        trace.get_current_span().set_attribute("onceflow.replayed", True)
        if record.state is not RecordState.SUCCEEDED:
            raise replayed_problem(record.response_body)
        stored = CallView.model_validate(record.response_body)
        if stored.ended:
            return _replay(record, task_id=task_id)
        # Parked, awaiting approval or running when it was stored: the call may have been
        # decided or have ended since. The task answers the same call by its id.
        try:
            view = await self._ask_task(task_id, call, deadline)
        except CallRefused as refused:
            # The task has ended since (only then is a call it knows refused): its status
            # still lists the call. One it never took (its first request gave up before
            # the task answered) gets the refusal, as its first request would have.
            status = await self._status_or_none(task_id)
            if status is None:
                raise await self._unanswered(task_id) from None
            view = call_view(_answer_from(task_id, status, call))
            if view.state is StepState.PENDING:
                if await self._records.refresh(
                    record,
                    state=RecordState.FAILED,
                    status_code=refused.status,
                    response_body=refused.problem(),
                ):
                    raise
                return await self._stored_call_answer(record, task_id)
        if view.ended:
            body = view.model_dump(mode="json")
            if not await self._records.refresh(
                record,
                state=RecordState.SUCCEEDED,
                status_code=call_status_code(view),
                response_body=body,
            ):
                # Another request stored the final answer first: every replay gets that one.
                return await self._stored_call_answer(record, task_id)
        return BoundaryAnswer(
            status_code=call_status_code(view),
            body=view.model_dump(mode="json"),
            task_id=task_id,
            replayed=True,
        )

    async def _stored_call_answer(self, record: IdempotencyRecord, task_id: str) -> BoundaryAnswer:
        current = await self._records.get(record.scope, record.idempotency_key)
        if current is None or not current.is_terminal:
            # Pruned in between: answer with what was read.
            current = record
        if current.state is not RecordState.SUCCEEDED:
            raise replayed_problem(current.response_body)
        return _replay(current, task_id=task_id)

    async def _ask_task(self, task_id: str, call: CallInput, deadline: float) -> CallView:
        """Send the call and return the task's answer; when the bounded wait is over
        first, the call's state as the task's status shows it. The wait bounds the
        answer, never the delivery: the call is sent until the task has taken it (or
        ``STATUS_QUERY_TIMEOUT`` passes with no worker to take it: ``pending``, and
        sending it again is then what makes it run)."""
        loop = asyncio.get_running_loop()
        async with _backend_errors():
            try:
                sent = await asyncio.wait_for(
                    self._tasks.send_call(task_id, call),
                    max(deadline - loop.time(), STATUS_QUERY_TIMEOUT),
                )
                # A refusal is known when the call is sent (no round trip to read it):
                # even a gateway that never waits reports it.
                answer: CallAnswer = await asyncio.wait_for(
                    sent.answer(), max(deadline - loop.time(), KNOWN_ANSWER_WAIT)
                )
            # Temporal's client turns the cancelled wait into its own error.
            except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
                answer = await self._call_now(task_id, call)
        return call_view(answer)

    async def _call_now(self, task_id: str, call: CallInput) -> CallAnswer:
        return _answer_from(task_id, await self._status_or_none(task_id), call)

    async def _status_or_none(self, task_id: str) -> TaskStatus | None:
        """The task's status, or None when no worker answered the query in time."""
        try:
            return await asyncio.wait_for(self._tasks.status(task_id), STATUS_QUERY_TIMEOUT)
        except (TimeoutError, RPCError, WorkflowQueryFailedError):
            return None

    async def _complete_call(
        self, record: IdempotencyRecord, task_id: str, answer: BoundaryAnswer | OnceflowError
    ) -> None:
        if isinstance(answer, BoundaryAnswer):
            state, status_code, body = RecordState.SUCCEEDED, answer.status_code, answer.body
        else:
            state, status_code, body = RecordState.FAILED, answer.status, answer.problem()
        stored = await self._records.complete(
            record, state=state, status_code=status_code, response_body=body, resource_id=task_id
        )
        if not stored:
            log.warning(
                "claim of key %s in %s was taken over while calling task %s",
                key_digest(record.idempotency_key),
                record.scope,
                task_id,
            )

    async def close_task(self, principal: Principal, task_id: str) -> TaskStatus:
        """Close an open task of the principal's tenant: it takes no more calls and ends
        once its unfinished calls end. Idempotent: closing a closing or closed task
        answers with its status.

        Raises:
            TaskNotOpen: The task is a plan.
        """
        attributes: dict[str, AttributeValue] = {
            "onceflow.tenant": principal.tenant,
            "onceflow.principal": principal.name,
            "onceflow.workflow_id": task_id[:1000],
        }
        with boundary_span("tasks.close", attributes):
            status = await self.task_status(principal, task_id)
            if not status.open:
                raise TaskNotOpen(
                    "this task is a plan: it ends with its last step", task_id=task_id
                )
            async with _backend_errors():
                try:
                    return await asyncio.wait_for(self._tasks.close(task_id), STATUS_QUERY_TIMEOUT)
                except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
                    unanswered = await self._unanswered(task_id)
                    if isinstance(unanswered, TaskUnanswered):
                        unanswered = TaskUnanswered(
                            f"{unanswered.detail}; closing again is safe",
                            retry_after_seconds=unanswered.retry_after_seconds or 2,
                        )
                    raise unanswered from None
                except CallRefused as refused:
                    raise TaskNotOpen(str(refused), task_id=task_id) from None

    # ── decisions ───────────────────────────────────────────────────────────────────

    async def approve(
        self, principal: Principal, task_id: str, body: Any, idempotency_key: str | None = None
    ) -> DecisionReply:
        """Approve or deny a step awaiting approval, as the calling principal.

        A repeat of the decision the step already got answers with that decision
        (``replayed``); another decision on a decided step, or any on an ended task,
        raises ``DecisionConflict``. ``idempotency_key`` is optional; when sent, the
        request is claimed like every other POST: the same key and body get the first
        answer again (a refusal included), the same key with another body or task
        raises ``KeyReusedWithDifferentRequest``.
        """
        attributes = _decision_attributes(principal, task_id, "approve", idempotency_key)
        with boundary_span("tasks.approve", attributes):
            return await self._approve(principal, task_id, body, idempotency_key)

    async def _approve(
        self, principal: Principal, task_id: str, body: Any, idempotency_key: str | None
    ) -> DecisionReply:
        self._check_decider(principal)
        key = _checked_optional_key(idempotency_key)
        request = _parsed(ApproveRequest, body)
        decision = ApproveInput(
            step_id=request.step_id,
            approved=request.approved,
            approver=principal.name,
            reason=request.reason,
            arguments_digest=request.arguments_digest,
        )
        return await self._decide_once(principal, task_id, "approve", request, decision, key)

    async def reconcile(
        self, principal: Principal, task_id: str, body: Any, idempotency_key: str | None = None
    ) -> DecisionReply:
        """Decide a parked step, as the calling principal (repeats and keys as for
        ``approve``)."""
        attributes = _decision_attributes(principal, task_id, "reconcile", idempotency_key)
        with boundary_span("tasks.reconcile", attributes):
            return await self._reconcile(principal, task_id, body, idempotency_key)

    async def _reconcile(
        self, principal: Principal, task_id: str, body: Any, idempotency_key: str | None
    ) -> DecisionReply:
        self._check_decider(principal)
        key = _checked_optional_key(idempotency_key)
        request = _parsed(ReconcileRequest, body)
        try:
            finding = ReconcileInput(
                step_id=request.step_id,
                decision=request.decision,
                operator=principal.name,
                reason=request.reason,
                resource_id=request.resource_id,
                unverified=request.unverified,
            )
        except ValidationError as invalid:
            raise _invalid(invalid, location=()) from None
        return await self._decide_once(principal, task_id, "reconcile", request, finding, key)

    async def _decide_once(
        self,
        principal: Principal,
        task_id: str,
        operation: str,
        request: BaseModel,
        decision: ApproveInput | ReconcileInput,
        key: str | None,
    ) -> DecisionReply:
        if key is None:
            await self.task_status(principal, task_id)
            return _decision_reply(await self._decide(task_id, decision))
        scope = _scope(principal, "task", operation)
        claim = self._new_claim(
            principal,
            scope=scope,
            idempotency_key=key,
            fingerprint=request_fingerprint(
                operation=f"tasks.{operation}",
                scope=scope,
                route=f"POST /v1/tasks/{task_id}/{operation}",
                body=request.model_dump(mode="json"),
            ),
            # The record's own identity: no workflow is ever started under it.
            workflow_id=derive_task_workflow_id(
                tenant=principal.tenant, scope=scope, idempotency_key=key
            ),
        )
        async with _backend_errors():
            earlier = await self._records.get(scope, key)
        if earlier is None:
            # Only a task of the principal's tenant can be decided; a task that is not
            # there reserves nothing. A key used before is answered from its record even
            # when the task is no longer queryable (no worker, or Temporal forgot it).
            await self.task_status(principal, task_id)
        return await self._claim_decision(claim, task_id, decision, earlier)

    async def _claim_decision(
        self,
        claim: NewClaim,
        task_id: str,
        decision: ApproveInput | ReconcileInput,
        earlier: IdempotencyRecord | None,
    ) -> DecisionReply:
        async def replayed(record: IdempotencyRecord) -> DecisionReply:
            return _replayed_decision(record)

        return await self._settle_claim(
            claim,
            target=task_id,
            doing="sending this decision",
            deadline=self._reply_deadline(),
            earlier=earlier,
            owned=lambda record: self._decide_claimed(record, task_id, decision),
            finished=replayed,
        )

    async def _decide_claimed(
        self, record: IdempotencyRecord, task_id: str, decision: ApproveInput | ReconcileInput
    ) -> DecisionReply:
        try:
            answer = await self._decide(task_id, decision)
        except (DecisionRefused, DecisionConflict) as refused:
            # The task's own, definitive answer: the key keeps it.
            await self._complete_decision(record, task_id, refused)
            raise
        except Exception:
            # No answer came (the task service or the database failed). Unlike a task
            # start, the claim may go: whether or not the task took the decision, a retry
            # with the key sends it again and the task answers with its one decision.
            await self._release_claim(record)
            raise
        reply = _decision_reply(answer)
        await self._complete_decision(record, task_id, reply)
        return reply

    async def _complete_decision(
        self, record: IdempotencyRecord, task_id: str, answer: DecisionReply | OnceflowError
    ) -> None:
        if isinstance(answer, DecisionReply):
            state, status_code, body = RecordState.SUCCEEDED, 200, answer.body
        else:
            state, status_code, body = RecordState.FAILED, answer.status, answer.problem()
        stored = await self._records.complete(
            record, state=state, status_code=status_code, response_body=body, resource_id=task_id
        )
        if not stored:
            log.warning(
                "claim of key %s in %s was taken over while deciding task %s",
                key_digest(record.idempotency_key),
                record.scope,
                task_id,
            )

    async def _release_claim(self, record: IdempotencyRecord) -> None:
        try:
            await self._records.release(record)
        except (psycopg.Error, PoolTimeout) as error:
            # The claim's lease runs out instead; a retry with the key then takes it over.
            log.warning(
                "could not release key %s in %s (%s)",
                key_digest(record.idempotency_key),
                record.scope,
                type(error).__name__,
            )

    async def _decide(
        self, task_id: str, decision: ApproveInput | ReconcileInput
    ) -> DecisionAnswer:
        async with _backend_errors():
            if isinstance(decision, ApproveInput):
                answer = await self._tasks.approve(task_id, decision)
            else:
                answer = await self._tasks.reconcile(task_id, decision)
        trace.get_current_span().set_attribute("onceflow.replayed", answer.replayed)
        return answer

    # ── the claim and what follows it ────────────────────────────────────────────────

    async def _submit(self, submission: _Submission) -> BoundaryAnswer:
        principal = submission.principal
        workflow_id = derive_task_workflow_id(
            tenant=principal.tenant,
            scope=submission.scope,
            idempotency_key=submission.idempotency_key,
        )
        claim = self._new_claim(
            principal,
            scope=submission.scope,
            idempotency_key=submission.idempotency_key,
            fingerprint=submission.fingerprint,
            workflow_id=workflow_id,
        )
        deadline = self._reply_deadline()

        async def replayed(record: IdempotencyRecord) -> BoundaryAnswer:
            return _replay(record)

        async def started(record: IdempotencyRecord) -> BoundaryAnswer | None:
            # Another request started the task: answer as it would have.
            if not record.task_started:
                return None
            if submission.task.open is not None:
                return await self._open_task_answer(record, replayed=True)
            return await self._answer_when_done(record, deadline, replayed=True)

        return await self._settle_claim(
            claim,
            target=workflow_id,
            doing="starting the task",
            deadline=deadline,
            owned=lambda record: self._start_claimed(record, submission, deadline),
            finished=replayed,
            in_flight=started,
        )

    def _reply_deadline(self) -> float:
        """When a request stops waiting for another one holding its key (loop time)."""
        return asyncio.get_running_loop().time() + self._settings.replay_wait_seconds

    async def _settle_claim(
        self,
        claim: NewClaim,
        *,
        target: str,
        doing: str,
        deadline: float,
        owned: Callable[[IdempotencyRecord], Awaitable[_Answer]],
        finished: Callable[[IdempotencyRecord], Awaitable[_Answer]],
        earlier: IdempotencyRecord | None = None,
        in_flight: Callable[[IdempotencyRecord], Awaitable[_Answer | None]] | None = None,
        retry_after: Callable[[IdempotencyRecord], float] | None = None,
    ) -> _Answer:
        """Claim ``(scope, key)`` or settle with whoever holds it: the one loop behind
        every keyed request.

        Args:
            claim: The claim this request makes.
            target: The task it is about, for logs.
            doing: What the key's owner is doing, for the in-progress answer.
            deadline: Loop time after which the request stops waiting for an owner.
            owned: Runs the request once this one holds the claim (new or taken over).
            finished: Answers from a terminal record with the same fingerprint.
            earlier: The record already read for this key, if any (no claim attempt).
            in_flight: Answers from a live owner's record when it can (None: keep waiting).
            retry_after: Seconds a caller should wait when the owner is still at it.
                Default: what is left of the owner's lease.

        Raises:
            KeyReusedWithDifferentRequest: The key's record has another fingerprint.
            RequestInProgress: Another request still holds the key at ``deadline``.
        """
        digest = key_digest(claim.idempotency_key)
        loop = asyncio.get_running_loop()
        pause = _POLL_FIRST
        async with _backend_errors():
            outcome: Claimed | AlreadyClaimed = (
                AlreadyClaimed(earlier) if earlier is not None else await self._records.claim(claim)
            )
            while True:
                if isinstance(outcome, Claimed):
                    log.info("claimed key %s in %s for task %s", digest, claim.scope, target)
                    return await owned(outcome.record)
                record = outcome.record
                if record.request_hash != claim.request_hash:
                    log.info(
                        "refused key %s in %s: reused for another request", digest, claim.scope
                    )
                    raise KeyReusedWithDifferentRequest(KEY_REUSED_DETAIL, key_digest=digest)
                if record.is_terminal:
                    log.info("replaying key %s in %s (task %s)", digest, claim.scope, target)
                    return await finished(record)
                if in_flight is not None:
                    answer = await in_flight(record)
                    if answer is not None:
                        return answer
                if record.lease_expired:
                    taken = await self._records.take_over(record, lease=claim.lease)
                    if taken is not None:
                        log.warning(
                            "took over key %s in %s after its claim's lease expired "
                            "(fencing token %d)",
                            digest,
                            claim.scope,
                            taken.fencing_token,
                        )
                        return await owned(taken)
                left = deadline - loop.time()
                if left <= 0:
                    wait = retry_after(record) if retry_after else record.lease_left.total_seconds()
                    raise RequestInProgress(
                        f"another request with this Idempotency-Key is {doing}; retry with "
                        "the same key and body",
                        retry_after_seconds=max(1, math.ceil(wait)),
                        key_digest=digest,
                    )
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, _POLL_MAX)
                current = await self._records.get(claim.scope, claim.idempotency_key)
                # Gone (pruned, or released after a failure) means nobody holds the key
                # now: claim it anew.
                outcome = (
                    AlreadyClaimed(current)
                    if current is not None
                    else await self._records.claim(claim)
                )

    def _new_claim(
        self,
        principal: Principal,
        *,
        scope: str,
        idempotency_key: str,
        fingerprint: str,
        workflow_id: str,
    ) -> NewClaim:
        return NewClaim(
            scope=scope,
            idempotency_key=idempotency_key,
            request_hash=fingerprint,
            tenant=principal.tenant,
            principal_id=principal.principal_id,
            workflow_id=workflow_id,
            lease=self._settings.claim_lease,
            result_retention=self._settings.result_retention,
            key_quota=principal.key_quota or self._settings.default_key_quota,
            quota_window_seconds=self._settings.quota_window_seconds,
        )

    async def _start_claimed(
        self, record: IdempotencyRecord, submission: _Submission, deadline: float
    ) -> BoundaryAnswer:
        if self._after_claim is not None:
            await self._after_claim()
        try:
            handle = await self._tasks.start(
                submission.task,
                workflow_id=record.workflow_id,
                memo={
                    REQUEST_HASH_MEMO: record.request_hash,
                    STARTED_BY_CLAIM_MEMO: _claim_mark(record),
                },
            )
            described = await handle.describe()
        except RPCError as error:
            if error.status in TEMPORAL_UNREACHABLE:
                # Whether or not the start reached Temporal, the claim may go: the workflow
                # id is derived from the key, so a retry with the key joins the task if it
                # did start, and the fingerprint in its memo refuses another body. Kept, the
                # claim would answer every retry 409 until its lease ran out.
                await self._release_claim(record)
            raise
        memo = await described.memo()
        if memo.get(REQUEST_HASH_MEMO) != record.request_hash:
            # Only after a pruned record: the key's task is still known to Temporal but
            # was started for another request. Nothing was started now, so the claim goes.
            await self._records.release(record)
            raise KeyReusedWithDifferentRequest(
                KEY_REUSED_DETAIL, key_digest=key_digest(record.idempotency_key)
            )
        # An open task continues as new when it grows long, and then writes its outcome
        # from a later run: its record is not bound to the first run (the workflow id,
        # which is never reused, still fences it).
        run_id = described.run_id if submission.task.open is None else None
        if not await self._records.mark_started(record, run_id=run_id):
            log.warning("claim on task %s was taken over while starting it", record.workflow_id)
        # A task another claim started (a retry after its record was pruned, or after
        # the first owner's lease ran out) answers with its result: this request executed
        # nothing. A task this claim started may already have ended: not a replay.
        already_closed = described.status is not WorkflowExecutionStatus.RUNNING
        started_here = memo.get(STARTED_BY_CLAIM_MEMO) == _claim_mark(record)
        if submission.task.open is not None:
            if already_closed:
                return await self._open_task_answer(record, replayed=True)
            self._remember_task(record.workflow_id, tenant=record.tenant, is_open=True)
            # Nothing has happened in the task yet: no need to ask it.
            view = TaskView(
                task_id=record.workflow_id,
                state=TaskState.RUNNING,
                steps=[],
                status_url=task_status_url(record.workflow_id),
                open=True,
            )
            return BoundaryAnswer(
                status_code=CREATED_STATUS_CODE,
                body=view.model_dump(mode="json"),
                task_id=record.workflow_id,
                replayed=False,
            )
        return await self._answer_when_done(record, deadline, replayed=not started_here)

    async def _open_task_answer(
        self, record: IdempotencyRecord, *, replayed: bool
    ) -> BoundaryAnswer:
        """An open task's creation answered again: 201 and its view while it is open;
        once it closed, its final view, stored (the workflow stores it itself when it
        closes; this covers a close whose write did not reach the record)."""
        try:
            status: TaskStatus | None = await asyncio.wait_for(
                self._tasks.status(record.workflow_id), STATUS_QUERY_TIMEOUT
            )
        except (TimeoutError, RPCError, WorkflowQueryFailedError):
            status = None
        if status is None or not is_terminal(status):
            view = (
                task_view(status)
                if status is not None
                else TaskView(
                    task_id=record.workflow_id,
                    state=TaskState.RUNNING,
                    steps=[],
                    status_url=task_status_url(record.workflow_id),
                    open=True,
                )
            )
            return BoundaryAnswer(
                status_code=CREATED_STATUS_CODE,
                body=view.model_dump(mode="json"),
                task_id=record.workflow_id,
                replayed=replayed,
            )
        return await self._store_ended(record, status, replayed=replayed)

    async def _answer_when_done(
        self, record: IdempotencyRecord, deadline: float, *, replayed: bool
    ) -> BoundaryAnswer:
        left = max(deadline - asyncio.get_running_loop().time(), 0.0)
        try:
            status = await asyncio.wait_for(self._tasks.result(record.workflow_id), left)
        except TimeoutError:
            current: TaskStatus | None
            try:
                current = await asyncio.wait_for(
                    self._tasks.status(record.workflow_id), STATUS_QUERY_TIMEOUT
                )
            except (TimeoutError, RPCError):
                # No worker answered the query (none polling, or the one holding the task
                # died mid-query: "context canceled"): still accepted, nothing more to tell.
                current = None
            if current is None or not is_terminal(current):
                view = (
                    task_view(current)
                    if current is not None
                    else TaskView(
                        task_id=record.workflow_id,
                        state=TaskState.RUNNING,
                        steps=[],
                        status_url=task_status_url(record.workflow_id),
                    )
                )
                return BoundaryAnswer(
                    status_code=IN_PROGRESS_STATUS_CODE,
                    body=view.model_dump(mode="json"),
                    task_id=record.workflow_id,
                    replayed=replayed,
                )
            status = current
        except WorkflowFailureError as failure:
            status = await self._closed_abnormally(record.workflow_id, failure)
        return await self._store_ended(record, status, replayed=replayed)

    async def _store_ended(
        self, record: IdempotencyRecord, status: TaskStatus, *, replayed: bool
    ) -> BoundaryAnswer:
        stored = await self._records.get(record.scope, record.idempotency_key)
        if stored is not None and stored.is_terminal:
            return _replay(stored, replayed=replayed)
        # The task ended but its outcome did not reach the record: use the task's own
        # result and store it, fenced exactly like the workflow's write.
        state, status_code, body, resource_id = stored_outcome(status)
        await self._records.record_outcome(
            workflow_id=record.workflow_id,
            run_id=None,
            state=state,
            status_code=status_code,
            response_body=body,
            resource_id=resource_id,
        )
        log.warning("stored the outcome of task %s from its result", record.workflow_id)
        return BoundaryAnswer(
            status_code=status_code, body=body, task_id=record.workflow_id, replayed=replayed
        )

    async def _closed_abnormally(
        self, workflow_id: str, failure: WorkflowFailureError
    ) -> TaskStatus:
        # Terminated, cancelled or timed out by Temporal: the task failed as a whole.
        last = await self._tasks.status(workflow_id)
        reason = f"the task's workflow closed without a result ({type(failure.cause).__name__})"
        return last.model_copy(update={"state": TaskState.FAILED, "failure_reason": reason})

    # ── checks ──────────────────────────────────────────────────────────────────────

    def _check_budget(self, budget: RetryBudget | None) -> None:
        if budget is None:
            return
        window = budget.longest_retry_window
        if window >= self._settings.result_retention:
            raise InvalidRequest(
                f"the budget's retry window ({window.total_seconds():g} s) must be shorter "
                f"than the result retention ({self._settings.result_retention_seconds:g} s)",
                errors=[{"loc": ["budget"], "msg": "retry window outlives result retention"}],
            )

    def check_tool(self, principal: Principal, tool: str) -> None:
        """Raise ``UnknownToolRequested`` or ``ToolNotAllowed`` before a body is read."""
        self._allowed_tool(principal, tool)

    def _allowed_tool(self, principal: Principal, tool: str) -> ToolContract:
        try:
            contract = self._catalogue.get(tool)
        except UnknownTool:
            raise UnknownToolRequested("no tool of that name exists") from None
        if not principal.may_call(tool):
            raise ToolNotAllowed(f"principal {principal.name!r} may not call {tool!r}")
        return contract

    @staticmethod
    def _check_decider(principal: Principal) -> None:
        if not principal.may_decide:
            raise DecisionsNotAllowed(
                f"principal {principal.name!r} may not approve or reconcile tasks"
            )


def _task_submission(
    principal: Principal, key: str, normalized: dict[str, Any], task: AgentTaskInput
) -> "_Submission":
    """A task start (plan or open) to claim under ``POST /v1/tasks``'s scope."""
    scope = _scope(principal, "task", "create")
    return _Submission(
        principal=principal,
        scope=scope,
        idempotency_key=key,
        fingerprint=request_fingerprint(
            operation="tasks.create", scope=scope, route="POST /v1/tasks", body=normalized
        ),
        task=task,
    )


def derive_call_id(scope: str, idempotency_key: str) -> str:
    """The call id of a call sent without one: derived from its key (and the key's scope),
    so a resend of the same request is the same call in the task too. The key itself
    never reaches the task's history."""
    digest = hashlib.sha256(f"v1\x00{scope}\x00{idempotency_key}".encode()).hexdigest()
    return f"key-{digest[:32]}"


def _claim_mark(record: IdempotencyRecord) -> str:
    """What names a claim in its task's memo: a digest of the claim's owner token (the
    token itself fences the record's writes, so it stays in the database)."""
    return hashlib.sha256(f"claim\x00{record.owner_token}".encode()).hexdigest()[:32]


def _scope(principal: Principal, target: str, operation: str) -> str:
    """The boundary that makes key reuse safe: tenant, principal, tool or task, operation."""
    return f"{principal.tenant}:{principal.name}:{target}:{operation}"


def _checked_key(raw: str | None) -> str:
    if raw is None or raw == "":
        raise MissingIdempotencyKey(
            "this call has an effect: send an Idempotency-Key that identifies this logical "
            "attempt, and the same key on every retry of it"
        )
    return check_idempotency_key(raw)


def _checked_optional_key(raw: str | None) -> str | None:
    """A decision may carry a key; one that is sent must be well formed."""
    return _checked_key(raw) if raw else None


def _validated_arguments(
    model: type[BaseModel], arguments: Any, *, location: tuple[str | int, ...]
) -> dict[str, Any]:
    # NUL and lone surrogates pass JSON parsing and validation, then fail in PostgreSQL
    # (text cannot hold NUL) or in a UTF-8 encoder (the history, the reply): refused here,
    # before anything is reserved.
    unstorable = unstorable_locations(arguments)
    if unstorable:
        named = {
            found.kind: ("an " if found.kind[0] in "aeiou" else "a ") + found.kind
            for found in unstorable
        }
        raise InvalidRequest(
            f"the arguments hold {' and '.join(sorted(named.values()))}; text in arguments "
            "must be valid Unicode without NUL (U+0000) or unpaired surrogates (U+D800 to "
            "U+DFFF)",
            errors=[
                {
                    "loc": [*location, *found.location],
                    "msg": f"{'key ' if found.in_key else ''}holds {named[found.kind]}",
                }
                for found in unstorable
            ],
        )
    # Arguments become the task's history, shown in the Temporal UI and kept for its
    # retention: a card number or an API key there would be stored and shown in clear.
    # Scanned as sent, so ignored fields count too, and before validation, whose errors
    # would name a key that holds a card number.
    sensitive = sensitive_locations(arguments)
    if sensitive:
        kinds = " and ".join(sorted({found.kind for found in sensitive}))
        raise InvalidRequest(
            f"the arguments hold a {kinds}; onceflow never takes card data or credentials "
            "as tool arguments (pass a saved payment method, pm_…, for a card)",
            errors=[
                {
                    "loc": [*location, *found.location],
                    "msg": f"{'key ' if found.in_key else ''}looks like a {found.kind}"
                    + (f" ({found.detail})" if found.detail else ""),
                }
                for found in sensitive
            ],
        )
    try:
        normalized: dict[str, Any] = validate_strictly(model, arguments).model_dump(mode="json")
    except ValidationError as invalid:
        raise _invalid(invalid, location=location) from None
    return normalized


def _request_attributes(
    principal: Principal, scope: str, idempotency_key: str | None
) -> dict[str, AttributeValue]:
    """The gateway span's identity attributes; the key only as its digest."""
    attributes: dict[str, AttributeValue] = {
        "onceflow.tenant": principal.tenant,
        "onceflow.principal": principal.name,
        "onceflow.scope": scope,
    }
    if idempotency_key:
        attributes["onceflow.key_digest"] = key_digest(idempotency_key)
    return attributes


def _decision_attributes(
    principal: Principal, task_id: str, operation: str, idempotency_key: str | None
) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        "onceflow.tenant": principal.tenant,
        "onceflow.principal": principal.name,
        "onceflow.workflow_id": task_id[:1000],
    }
    if idempotency_key:
        attributes["onceflow.scope"] = _scope(principal, "task", operation)
        attributes["onceflow.key_digest"] = key_digest(idempotency_key)
    return attributes


def _answer_from(task_id: str, status: TaskStatus | None, call: CallInput) -> CallAnswer:
    """The call as the task's status lists it; ``pending`` when the task has not taken
    it (or its status is unknown)."""
    task_state = status.state if status is not None else TaskState.RUNNING
    for step in status.steps if status is not None else []:
        if step.step_id == call.call_id:
            return CallAnswer(
                task_id=task_id, task_state=task_state, call=step, repeat_of=step.repeat_of
            )
    return CallAnswer(
        task_id=task_id,
        task_state=task_state,
        call=StepStatus(
            step_id=call.call_id,
            tool=call.tool,
            state=StepState.PENDING,
            arguments={},
            arguments_digest=arguments_digest(call.tool, call.arguments),
            deliberate_repeat=call.deliberate_repeat,
        ),
    )


def _decision_reply(answer: DecisionAnswer) -> DecisionReply:
    return DecisionReply(body=answer.model_dump(mode="json"), replayed=answer.replayed)


def _replayed_decision(record: IdempotencyRecord) -> DecisionReply:
    """The stored answer of a keyed decision: the accepted one, or its refusal raised."""
    trace.get_current_span().set_attribute("onceflow.replayed", True)
    if record.state is RecordState.SUCCEEDED:
        return DecisionReply(body=record.response_body, replayed=True)
    raise replayed_problem(record.response_body)


def _annotated(answer: BoundaryAnswer) -> BoundaryAnswer:
    """Record on the request's span which task answered it and how."""
    trace.get_current_span().set_attributes(
        {
            "onceflow.workflow_id": answer.task_id,
            "onceflow.replayed": answer.replayed,
            "http.response.status_code": answer.status_code,
        }
    )
    return answer


def _parsed(model: type[BaseModel], body: Any) -> Any:
    try:
        return validate_strictly(model, body)
    except ValidationError as invalid:
        raise _invalid(invalid, location=()) from None


def _invalid(invalid: ValidationError, *, location: tuple[str | int, ...]) -> InvalidRequest:
    problems = validation_problems(invalid, location=location)
    summary = describe_validation(problems, whole="body", limit=5)
    return InvalidRequest(f"invalid request: {summary}", errors=problems)


def _replay(
    record: IdempotencyRecord, *, replayed: bool = True, task_id: str | None = None
) -> BoundaryAnswer:
    """The record's stored answer; ``task_id``: the task a call's record answers for (its
    own ``workflow_id`` only names the record, no task runs under it)."""
    assert record.status_code is not None
    return BoundaryAnswer(
        status_code=record.status_code,
        body=record.response_body,
        task_id=task_id or record.workflow_id,
        replayed=replayed,
    )


async def _answers(backend: str, probe: Awaitable[object], timeout: float) -> bool:
    """Whether ``probe`` completed within ``timeout`` seconds."""
    try:
        await asyncio.wait_for(probe, timeout)
    except Exception as error:
        # The type only, as everywhere in the gateway's logs.
        log.warning("readiness: %s did not answer (%s)", backend, type(error).__name__)
        return False
    return True


TEMPORAL_UNREACHABLE = (
    RPCStatusCode.UNAVAILABLE,
    RPCStatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.RESOURCE_EXHAUSTED,
)
"""Temporal's answers that mean it could not be reached (or would not take the call now)."""
UPDATES_IN_FLIGHT = "concurrent in-flight updates"
"""In Temporal's RESOURCE_EXHAUSTED answer when a workflow holds ten Updates in flight."""


@asynccontextmanager
async def _backend_errors() -> AsyncIterator[None]:
    """Turn an unreachable Temporal or PostgreSQL into ``BackendUnavailable``.

    A claim already made is kept unless its owner released it (a task start that did not
    reach Temporal, a call or a decision that got no answer): only a retry with the same
    key (which takes the claim over after its lease) may go on with it.
    """
    try:
        yield
    except PoolTimeout:
        raise BackendUnavailable("the database is busy; retry with the same key") from None
    except psycopg.OperationalError:
        raise BackendUnavailable("the database is unreachable; retry with the same key") from None
    except RPCError as error:
        if error.status is RPCStatusCode.RESOURCE_EXHAUSTED and UPDATES_IN_FLIGHT in str(error):
            raise TaskBusy(
                "the task is taking as many calls and decisions at once as Temporal allows "
                "(10 in flight); retry with the same key after Retry-After"
            ) from None
        if error.status in TEMPORAL_UNREACHABLE:
            raise BackendUnavailable(
                "the task service is unreachable; retry with the same key"
            ) from None
        raise
