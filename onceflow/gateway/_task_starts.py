"""Task starts at the boundary: one-step tool calls, plans and open tasks, each started
at most once per key and fingerprint (claim, start, answer).

A new claim starts the task workflow (id derived from scope and key, ``USE_EXISTING``)
and waits a bounded time for its result; a start that cannot reach Temporal releases the
claim, so a retry with the key starts (or joins) the task at once. The same fingerprint
on a terminal record replays the stored status and body, flagged as a replay; on a running
one it waits a bounded time, else answers in progress (202 and the task's URL; 409 while
the claim's owner has not marked the task started: ``MARK_STARTED_AFTER``). Another
fingerprint is refused.

This is two of a task outcome's four writers (the rules: ``onceflow.idempotency``): the
starter of a plan task writes its outcome when the task ends within its wait
(``_store_ended``), or, answering 202, tells the task it stopped waiting
(``_stop_waiting``) unless the task waits for a person (it then writes its own); and the
next repeat of a request whose record its task's end left processing stores the task's
result. An open task is created the same way, but answered as soon as it runs (201): it
ends only when it is closed. A task's status, once started, is the directory's
(``_task_directory``).
"""

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowQueryFailedError,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from onceflow.errors import (
    KEY_REUSED_DETAIL,
    InvalidRequest,
    KeyReusedWithDifferentRequest,
)
from onceflow.gateway._backend import STATUS_QUERY_TIMEOUT, TEMPORAL_UNREACHABLE
from onceflow.gateway._claims import Claims
from onceflow.gateway._fingerprint import request_fingerprint
from onceflow.gateway._principals import ALL_TOOLS, Principal
from onceflow.gateway._requests import (
    BoundaryAnswer,
    CreateOpenTaskRequest,
    CreateTaskRequest,
    allowed_tool,
    annotated,
    check_budget,
    checked_key,
    parsed,
    replayed_answer,
    request_attributes,
    request_scope,
    validated_arguments,
)
from onceflow.gateway._responses import (
    CREATED_STATUS_CODE,
    IN_PROGRESS_STATUS_CODE,
    running_view,
)
from onceflow.gateway._settings import GatewaySettings
from onceflow.gateway._task_directory import TaskDirectory
from onceflow.idempotency import (
    REQUEST_HASH_MEMO,
    STARTED_BY_CLAIM_MEMO,
    IdempotencyRecord,
    IdempotencyStore,
    OutcomeWriter,
    stored_outcome,
    task_view,
)
from onceflow.task_api import TaskClient
from onceflow.telemetry import boundary_span
from onceflow.tools.worker import Catalogue, derive_task_workflow_id, key_digest
from onceflow.workflows.task_models import (
    AgentTaskInput,
    OpenTaskOptions,
    StepInput,
    TaskStatus,
)

log = logging.getLogger("onceflow.gateway")

TOOL_CALL_STEP_ID = "1"
"""Step id of the single step of a one-step task (a tool call)."""
MARK_STARTED_AFTER = 1.0
"""Seconds a plan task this request started may run before its record is marked started
(``mark_started``). Most one-step tasks end sooner, and their outcome's write marks the
record in the same statement. Until the mark, a request with the same key polls the
record (it ends, or the mark comes) instead of waiting on the task; a starter that dies
before marking leaves a claim whose lease runs out: a retry then takes it over and joins
the task (its id is derived from the key), and the upkeep pass writes an ended task's
outcome (``IdempotencyStore.started_unrecorded``)."""


@dataclass(frozen=True)
class _Submission:
    principal: Principal
    scope: str
    idempotency_key: str = field(repr=False)
    fingerprint: str
    is_open: bool
    build_task: Callable[[], AgentTaskInput] = field(repr=False)
    """The task to start: built only by the request that owns the claim (a replay never
    needs it)."""


class TaskStarts:
    """Starts tasks once per key and fingerprint, waits for and replays their answers."""

    def __init__(
        self,
        *,
        claims: Claims,
        records: IdempotencyStore,
        tasks: TaskClient,
        settings: GatewaySettings,
        catalogue: Catalogue,
        directory: TaskDirectory,
        after_claim: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._claims = claims
        self._records = records
        self._tasks = tasks
        self._settings = settings
        self._catalogue = catalogue
        self._directory = directory
        self._after_claim = after_claim

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
        """``BoundaryService.call_tool``."""
        with self._tool_call_span(principal, tool, idempotency_key):
            return annotated(
                await self._call_tool(
                    principal, tool, arguments, idempotency_key, deliberate_repeat, request_digest
                )
            )

    def repeated_tool_call(
        self, principal: Principal, tool: str, idempotency_key: str, request_digest: str
    ) -> BoundaryAnswer | None:
        """``BoundaryService.repeated_tool_call``."""
        record = self._claims.repeat(
            request_scope(principal, tool, "call"), idempotency_key, request_digest
        )
        if record is None:
            return None
        with self._tool_call_span(principal, tool, idempotency_key):
            return annotated(replayed_answer(record))

    def _tool_call_span(
        self, principal: Principal, tool: str, idempotency_key: str | None
    ) -> AbstractContextManager[trace.Span]:
        # Only a catalogue name goes into the span: the path segment is the caller's text.
        known = tool if tool in self._catalogue else "unknown"
        attributes = request_attributes(
            principal, request_scope(principal, known, "call"), idempotency_key
        )
        return boundary_span(f"tools.call {known}", {**attributes, "onceflow.tool": known})

    async def _call_tool(
        self,
        principal: Principal,
        tool: str,
        arguments: Any,
        idempotency_key: str | None,
        deliberate_repeat: bool,
        request_digest: str | None,
    ) -> BoundaryAnswer:
        contract = allowed_tool(self._catalogue, principal, tool)
        key = checked_key(idempotency_key)
        if deliberate_repeat and not contract.deliberate_repeats:
            raise InvalidRequest(
                f"tool {tool!r} does not allow deliberate repeats: the same intent is "
                "answered by its first call",
                errors=[{"loc": ["deliberate_repeat"], "msg": "not allowed for this tool"}],
            )
        if not isinstance(arguments, dict):
            raise InvalidRequest(
                "the body must be a JSON object of the tool's arguments",
                errors=[{"loc": [], "msg": "Input should be an object"}],
            )
        normalized = validated_arguments(contract.input_model, arguments, location=())
        scope = request_scope(principal, tool, "call")
        submission = _Submission(
            principal=principal,
            scope=scope,
            idempotency_key=key,
            fingerprint=request_fingerprint(
                operation="tools.call",
                scope=scope,
                # A deliberate repeat is another request than the plain call (its own
                # route), and a plain call's fingerprint stays what it always was.
                route=f"POST /v1/tools/{tool}/calls"
                + ("?deliberate_repeat=true" if deliberate_repeat else ""),
                body=normalized,
            ),
            is_open=False,
            build_task=lambda: AgentTaskInput(
                tenant=principal.tenant,
                principal=principal.name,
                steps=[
                    StepInput(
                        step_id=TOOL_CALL_STEP_ID,
                        tool=tool,
                        arguments=normalized,
                        deliberate_repeat=deliberate_repeat,
                    )
                ],
                outcome_writer=OutcomeWriter.STARTER,
            ),
        )
        answer = await self._submit(submission)
        if request_digest is not None:
            self._claims.vouch(
                scope, key, fingerprint=submission.fingerprint, request_digest=request_digest
            )
        return answer

    async def create_task(
        self, principal: Principal, body: Any, idempotency_key: str | None
    ) -> BoundaryAnswer:
        """``BoundaryService.create_task``."""
        if isinstance(body, dict) and "open" in body:
            return await self.open_task(principal, body, idempotency_key)
        attributes = request_attributes(
            principal, request_scope(principal, "task", "create"), idempotency_key
        )
        with boundary_span("tasks.create", attributes):
            return annotated(await self._create_task(principal, body, idempotency_key))

    async def open_task(
        self, principal: Principal, body: Any, idempotency_key: str | None
    ) -> BoundaryAnswer:
        """``BoundaryService.open_task``."""
        attributes = request_attributes(
            principal, request_scope(principal, "task", "create"), idempotency_key
        )
        with boundary_span("tasks.open", attributes):
            return annotated(await self._open_task(principal, body, idempotency_key))

    async def _open_task(
        self, principal: Principal, body: Any, idempotency_key: str | None
    ) -> BoundaryAnswer:
        request = parsed(CreateOpenTaskRequest, body)
        key = checked_key(idempotency_key)
        check_budget(request.budget, self._settings)
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
            outcome_writer=OutcomeWriter.WORKFLOW,
        )
        return await self._submit(task_submission(principal, key, normalized, task))

    async def _create_task(
        self, principal: Principal, body: Any, idempotency_key: str | None
    ) -> BoundaryAnswer:
        request: CreateTaskRequest = parsed(CreateTaskRequest, body)
        contracts = [allowed_tool(self._catalogue, principal, step.tool) for step in request.steps]
        trace.get_current_span().set_attribute(
            "onceflow.tools", [step.tool for step in request.steps]
        )
        key = checked_key(idempotency_key)
        if len({step.step_id for step in request.steps}) != len(request.steps):
            raise InvalidRequest(
                "step ids must be unique within a task",
                errors=[{"loc": ["steps"], "msg": "step ids must be unique within a task"}],
            )
        steps = [
            StepInput(
                step_id=step.step_id,
                tool=step.tool,
                arguments=validated_arguments(
                    contract.input_model, step.arguments, location=("steps", index, "arguments")
                ),
            )
            for index, (step, contract) in enumerate(zip(request.steps, contracts, strict=True))
        ]
        check_budget(request.budget, self._settings)
        normalized = {
            "steps": [step.model_dump(mode="json") for step in steps],
            "budget": request.budget.model_dump(mode="json") if request.budget else None,
        }
        task = AgentTaskInput(
            tenant=principal.tenant,
            principal=principal.name,
            steps=steps,
            budget=request.budget,
            outcome_writer=OutcomeWriter.STARTER,
        )
        return await self._submit(task_submission(principal, key, normalized, task))

    async def _submit(self, submission: _Submission) -> BoundaryAnswer:
        principal = submission.principal
        workflow_id = derive_task_workflow_id(
            tenant=principal.tenant,
            scope=submission.scope,
            idempotency_key=submission.idempotency_key,
        )
        claim = self._claims.new(
            principal,
            scope=submission.scope,
            idempotency_key=submission.idempotency_key,
            fingerprint=submission.fingerprint,
            workflow_id=workflow_id,
        )
        deadline = self._claims.reply_deadline()

        async def replayed(record: IdempotencyRecord) -> BoundaryAnswer:
            return replayed_answer(record)

        async def started(record: IdempotencyRecord) -> BoundaryAnswer | None:
            # Another request started the task: answer as it would have.
            if not record.task_started:
                return None
            if submission.is_open:
                return await self._open_task_answer(record, replayed=True)
            return await self._answer_when_done(record, deadline, replayed=True)

        return await self._claims.settle(
            claim,
            target=workflow_id,
            doing="starting the task",
            deadline=deadline,
            owned=lambda record: self._start_claimed(record, submission, deadline),
            finished=replayed,
            in_flight=started,
        )

    async def _start_claimed(
        self, record: IdempotencyRecord, submission: _Submission, deadline: float
    ) -> BoundaryAnswer:
        if self._after_claim is not None:
            await self._after_claim()
        try:
            start = await self._start(record, submission.build_task())
        except RPCError as error:
            if error.status in TEMPORAL_UNREACHABLE:
                # Whether or not the start reached Temporal, the claim may go: the workflow
                # id is derived from the key, so a retry with the key joins the task if it
                # did start, and the fingerprint in its memo refuses another body. Kept, the
                # claim would answer every retry 409 until its lease ran out.
                await self._claims.release(record)
            raise
        if start.request_hash != record.request_hash:
            # Only after a pruned record: the key's task is still known to Temporal but
            # was started for another request. Nothing was started now, so the claim goes.
            await self._records.release(record)
            raise KeyReusedWithDifferentRequest(
                KEY_REUSED_DETAIL, key_digest=key_digest(record.idempotency_key)
            )
        if not submission.is_open and start.here and not start.closed:
            # A plan task this claim started: marked only if it is still running after
            # ``MARK_STARTED_AFTER`` (``_answer_when_done``); one that ends sooner is marked
            # by its outcome's write, one statement instead of two.
            return await self._answer_when_done(
                record, deadline, replayed=False, unmarked_run_id=start.run_id
            )
        # An open task continues as new when it grows long, and then writes its outcome
        # from a later run: its record is not bound to the first run (the workflow id,
        # which is never reused, still fences it).
        await self._mark_started(record, run_id=None if submission.is_open else start.run_id)
        # A task another claim started (a retry after its record was pruned, or after
        # the first owner's lease ran out) answers with its result: this request executed
        # nothing. A task this claim started may already have ended: not a replay.
        if submission.is_open:
            if start.closed:
                return await self._open_task_answer(record, replayed=True)
            self._directory.remember_task(record.workflow_id, tenant=record.tenant, is_open=True)
            # Nothing has happened in the task yet: no need to ask it.
            return BoundaryAnswer(
                status_code=CREATED_STATUS_CODE,
                body=running_view(record.workflow_id, is_open=True).model_dump(mode="json"),
                task_id=record.workflow_id,
                replayed=False,
            )
        return await self._answer_when_done(record, deadline, replayed=not start.here)

    async def _start(self, record: IdempotencyRecord, task: AgentTaskInput) -> "_Started":
        """Start the claimed task; or join the one its workflow id already names (a
        released claim's start that reached Temporal, a former lease owner's, a pruned
        record's), asking Temporal whose it is."""
        memo = {REQUEST_HASH_MEMO: record.request_hash, STARTED_BY_CLAIM_MEMO: claim_mark(record)}
        try:
            handle = await self._tasks.start(
                task, workflow_id=record.workflow_id, memo=memo, join=False
            )
        except WorkflowAlreadyStartedError:
            pass
        else:
            # Started now by this claim: no need to ask Temporal what it was given.
            assert handle.result_run_id is not None
            return _Started(
                run_id=handle.result_run_id,
                request_hash=record.request_hash,
                here=True,
                closed=False,
            )
        handle = await self._tasks.start(task, workflow_id=record.workflow_id, memo=memo)
        described = await handle.describe()
        found = await described.memo()
        return _Started(
            run_id=described.run_id,
            request_hash=found.get(REQUEST_HASH_MEMO),
            here=found.get(STARTED_BY_CLAIM_MEMO) == claim_mark(record),
            closed=described.status is not WorkflowExecutionStatus.RUNNING,
        )

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
        if status is None or not status.state.is_terminal:
            view = (
                task_view(status)
                if status is not None
                else running_view(record.workflow_id, is_open=True)
            )
            return BoundaryAnswer(
                status_code=CREATED_STATUS_CODE,
                body=view.model_dump(mode="json"),
                task_id=record.workflow_id,
                replayed=replayed,
            )
        return await self._store_ended(record, status, replayed=replayed)

    async def _mark_started(self, record: IdempotencyRecord, *, run_id: str | None) -> None:
        if not await self._records.mark_started(record, run_id=run_id):
            log.warning("claim on task %s was taken over while starting it", record.workflow_id)

    async def _stop_waiting(
        self, record: IdempotencyRecord, current: TaskStatus | None
    ) -> TaskStatus | None:
        """This request started the task and answers before it ends (``current``: its
        status, None when unanswered): the task writes its own outcome. One that waits
        for a person writes it anyway (it asked people) and one that ended is stored here:
        only another is told, by a signal. Returns the status to answer with: the final
        one if the task ended before the signal reached it."""
        if current is not None and (current.state.is_terminal or current.state.waits_for_people):
            return current
        try:
            signalled = await asyncio.wait_for(
                self._tasks.stop_waiting(record.workflow_id), STATUS_QUERY_TIMEOUT
            )
            if signalled:
                return current
            return await asyncio.wait_for(
                self._tasks.ended(record.workflow_id), STATUS_QUERY_TIMEOUT
            )
        except (TimeoutError, RPCError, WorkflowQueryFailedError) as error:
            # The next repeat with the key, or the upkeep pass, writes it instead.
            log.warning(
                "could not hand task %s its outcome's write (%s)",
                record.workflow_id,
                type(error).__name__,
            )
            return current

    async def _answer_when_done(
        self,
        record: IdempotencyRecord,
        deadline: float,
        *,
        replayed: bool,
        unmarked_run_id: str | None = None,
    ) -> BoundaryAnswer:
        """The task's answer once it ended, or 202 and its view at ``deadline``.

        ``unmarked_run_id``: the run this request started and has not marked in its record
        yet; marked if the task still runs after ``MARK_STARTED_AFTER`` (always before the
        request stops waiting), else by the outcome's write.
        """
        loop = asyncio.get_running_loop()
        ending = asyncio.ensure_future(self._tasks.result(record.workflow_id))
        try:
            if unmarked_run_id is not None:
                await asyncio.wait(
                    {ending}, timeout=min(MARK_STARTED_AFTER, max(deadline - loop.time(), 0.0))
                )
                if not ending.done():
                    await self._mark_started(record, run_id=unmarked_run_id)
            status = await asyncio.wait_for(ending, max(deadline - loop.time(), 0.0))
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
            if not replayed:
                current = await self._stop_waiting(record, current)
            if current is None or not current.state.is_terminal:
                view = (
                    task_view(current)
                    if current is not None
                    else running_view(record.workflow_id, is_open=False)
                )
                return BoundaryAnswer(
                    status_code=IN_PROGRESS_STATUS_CODE,
                    body=view.model_dump(mode="json"),
                    task_id=record.workflow_id,
                    replayed=replayed,
                )
            status = current
        except WorkflowFailureError as failure:
            status = await self._tasks.closed_abnormally(record.workflow_id, failure)
        finally:
            ending.cancel()  # only when this request stopped waiting for it
        return await self._store_ended(record, status, replayed=replayed, run_id=unmarked_run_id)

    async def _store_ended(
        self,
        record: IdempotencyRecord,
        status: TaskStatus,
        *,
        replayed: bool,
        run_id: str | None = None,
    ) -> BoundaryAnswer:
        # The request that waits for a plan task writes its outcome (the task itself
        # writes it only when it asked people, or for an open task): one write, fenced
        # exactly like the workflow's; the record's own answer when it already holds one.
        # ``run_id``: the run this request started, bound to the record if no mark did.
        state, status_code, body, resource_id = stored_outcome(status)
        written = await self._records.record_outcome(
            workflow_id=record.workflow_id,
            run_id=run_id,
            state=state,
            status_code=status_code,
            response_body=body,
            resource_id=resource_id,
        )
        if not written:
            stored = await self._records.get(record.scope, record.idempotency_key)
            if stored is not None and stored.is_terminal:
                return replayed_answer(stored, replayed=replayed)
        return BoundaryAnswer(
            status_code=status_code, body=body, task_id=record.workflow_id, replayed=replayed
        )


@dataclass(frozen=True)
class _Started:
    """The task a claim started or joined, as far as its request needs to know it."""

    run_id: str
    request_hash: str | None
    here: bool
    """Started by this claim (another's task answers as a replay: nothing ran for it)."""
    closed: bool


def task_submission(
    principal: Principal, key: str, normalized: dict[str, Any], task: AgentTaskInput
) -> "_Submission":
    """A task start (plan or open) to claim under ``POST /v1/tasks``'s scope."""
    scope = request_scope(principal, "task", "create")
    return _Submission(
        principal=principal,
        scope=scope,
        idempotency_key=key,
        fingerprint=request_fingerprint(
            operation="tasks.create", scope=scope, route="POST /v1/tasks", body=normalized
        ),
        is_open=task.open is not None,
        build_task=lambda: task,
    )


def claim_mark(record: IdempotencyRecord) -> str:
    """What names a claim in its task's memo: a digest of the claim's owner token (the
    token itself fences the record's writes, so it stays in the database)."""
    return hashlib.sha256(f"claim\x00{record.owner_token}".encode()).hexdigest()[:32]
