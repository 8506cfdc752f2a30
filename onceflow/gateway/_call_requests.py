"""Calls of open tasks at the boundary, each at most once per key and fingerprint.

Each call (``POST /v1/tasks/{id}/calls``) is claimed in the scope of its principal and
route, with the task id in its fingerprint, under a record that starts no workflow. The
claim's owner sends the call to the task (an Update, answered when the call ends, parks or
awaits approval) and stores the task's answer, a refusal included, as the key's result; it
releases the claim when the task service could not be reached. A call sent without a call
id gets one derived from its key, so a resend whose answer was lost is the same call in
the task too, which answers it by its id and never runs it twice. A stored answer that is
not final (the call had not ended) is not what a later request with the key gets: it asks
the task again with the same call and gets the call's current state, and the first final
answer replaces the stored one.
"""

import asyncio
import hashlib
from typing import Any

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue
from temporalio.client import WorkflowQueryFailedError, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError

from onceflow.errors import CallRefused, TaskNotOpen, TaskUnanswered, replayed_problem
from onceflow.gateway._backend import STATUS_QUERY_TIMEOUT, backend_errors
from onceflow.gateway._claims import Claims
from onceflow.gateway._fingerprint import request_fingerprint
from onceflow.gateway._principals import Principal
from onceflow.gateway._requests import (
    BoundaryAnswer,
    CallRequest,
    allowed_tool,
    annotated,
    checked_key,
    parsed,
    replayed_answer,
    request_attributes,
    request_scope,
    validated_arguments,
)
from onceflow.gateway._responses import CallView, call_status_code, call_view
from onceflow.gateway._settings import GatewaySettings
from onceflow.gateway._task_directory import TaskDirectory
from onceflow.idempotency import IdempotencyRecord, IdempotencyStore, NewClaim, RecordState
from onceflow.task_api import TaskClient
from onceflow.telemetry import boundary_span
from onceflow.tools import ToolContract
from onceflow.tools.worker import Catalogue, arguments_digest, derive_task_workflow_id
from onceflow.workflows.task_models import (
    CallAnswer,
    CallInput,
    StepState,
    StepStatus,
    TaskState,
    TaskStatus,
)

FINGERPRINTED_CALL_FIELDS = ("call_id", "tool", "arguments", "deliberate_repeat")
"""The fields of a call's ``CallInput`` its fingerprint covers: those 0.1.0 hashed (its
``CallInput`` less ``wait_until_ended``), so a key that release claimed is answered from its
record. Never add one: every key claimed before would then answer 422."""

KNOWN_ANSWER_WAIT = 0.5
"""The least a call waits for its answer once the task has taken it: enough to read one
Temporal already returned with the call (the task refused it), no more."""


class CallRequests:
    """Sends calls to open tasks once per key and fingerprint; closes open tasks."""

    def __init__(
        self,
        *,
        claims: Claims,
        records: IdempotencyStore,
        tasks: TaskClient,
        directory: TaskDirectory,
        settings: GatewaySettings,
        catalogue: Catalogue,
    ) -> None:
        self._claims = claims
        self._records = records
        self._tasks = tasks
        self._directory = directory
        self._settings = settings
        self._catalogue = catalogue

    def check_call(
        self, contract: ToolContract, arguments: Any, idempotency_key: str | None
    ) -> tuple[str, str]:
        """``BoundaryService.check_call``."""
        key = checked_key(idempotency_key)
        normalized = validated_arguments(contract.input_model, arguments, location=("arguments",))
        return key, arguments_digest(contract.name, normalized)

    async def task_of_call_key(self, principal: Principal, idempotency_key: str) -> str | None:
        """``BoundaryService.task_of_call_key``."""
        record = await self._claims.earlier(
            request_scope(principal, "task", "call"), idempotency_key
        )
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
        """``BoundaryService.call_in_task``."""
        attributes = request_attributes(
            principal, request_scope(principal, "task", "call"), idempotency_key
        )
        attributes["onceflow.workflow_id"] = task_id[:1000]
        with boundary_span("tasks.call", attributes):
            return annotated(
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
        request = parsed(CallRequest, body)
        contract = allowed_tool(self._catalogue, principal, request.tool)
        trace.get_current_span().set_attribute("onceflow.tool", request.tool)
        key = checked_key(idempotency_key)
        arguments = validated_arguments(
            contract.input_model, request.arguments, location=("arguments",)
        )
        scope = request_scope(principal, "task", "call")
        call = CallInput(
            call_id=request.call_id or derive_call_id(scope, key),
            tool=request.tool,
            arguments=arguments,
            deliberate_repeat=request.deliberate_repeat,
            wait_until_ended=wait_until_ended,
        )
        # What the caller asked for, and only that: how long to wait for the answer is not
        # part of it (the same call sent again with ``?wait=ended`` is the same request),
        # nor is a field the task's input gains (``policy``, filled in at admission):
        # either would make a retry of a call another release admitted a 422.
        normalized = call.model_dump(mode="json", include=set(FINGERPRINTED_CALL_FIELDS))
        claim = self._claims.new(
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
        if self._directory.knows(task_id):
            self._directory.check_open_task(principal, task_id)
        else:
            earlier = await self._claims.earlier(scope, key)
            if earlier is None:
                status = await self._directory.task_status(principal, task_id)
                self._directory.remember_task(task_id, tenant=status.tenant, is_open=status.open)
                self._directory.check_open_task(principal, task_id)
        return await self._claim_call(claim, task_id, call, earlier)

    async def _claim_call(
        self,
        claim: NewClaim,
        task_id: str,
        call: CallInput,
        earlier: IdempotencyRecord | None,
    ) -> BoundaryAnswer:
        deadline = self._claims.reply_deadline()

        def retry_after(record: IdempotencyRecord) -> float:
            # The owner answers within its own bounded wait, unless it died: then the
            # lease's end is when a retry may take the claim over.
            owner_answers_in = (
                self._settings.replay_wait_seconds
                + STATUS_QUERY_TIMEOUT
                - (record.read_at - record.created_at).total_seconds()
            )
            return min(record.lease_left.total_seconds(), owner_answers_in)

        return await self._claims.settle(
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
        # A refusal is the task's own, definitive answer. It recorded nothing, so a
        # corrected call under a new key is not blocked by it.
        view = await self._claims.answer_once(
            record,
            target=task_id,
            doing="calling",
            ask=lambda: self._ask_task(task_id, call, deadline),
            stored=lambda view: (call_status_code(view), view.model_dump(mode="json")),
            refusals=(CallRefused,),
        )
        return BoundaryAnswer(
            status_code=call_status_code(view),
            body=view.model_dump(mode="json"),
            task_id=task_id,
            replayed=False,
        )

    async def _replayed_call(
        self, record: IdempotencyRecord, task_id: str, call: CallInput, deadline: float
    ) -> BoundaryAnswer:
        """The key's stored answer when it is final; else the call's state now."""
        trace.get_current_span().set_attribute("onceflow.replayed", True)
        if record.state is not RecordState.SUCCEEDED:
            raise replayed_problem(record.response_body)
        stored = CallView.model_validate(record.response_body)
        if stored.ended:
            return replayed_answer(record, task_id=task_id)
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
                raise await self._directory.unanswered(task_id) from None
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
        return replayed_answer(current, task_id=task_id)

    async def _ask_task(self, task_id: str, call: CallInput, deadline: float) -> CallView:
        """Send the call and return the task's answer; when the bounded wait is over
        first, the call's state as the task's status shows it. The wait bounds the
        answer, never the delivery: the call is sent until the task has taken it (or
        ``STATUS_QUERY_TIMEOUT`` passes with no worker to take it: ``pending``, and
        sending it again is then what makes it run)."""
        loop = asyncio.get_running_loop()
        async with backend_errors():
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

    async def close_task(self, principal: Principal, task_id: str) -> TaskStatus:
        """``BoundaryService.close_task``."""
        attributes: dict[str, AttributeValue] = {
            "onceflow.tenant": principal.tenant,
            "onceflow.principal": principal.name,
            "onceflow.workflow_id": task_id[:1000],
        }
        with boundary_span("tasks.close", attributes):
            # A task this process knows needs no status query (Temporal Cloud bills each):
            # the close itself answers with the status, or times out as the query would.
            if not self._directory.knows(task_id):
                status = await self._directory.task_status(principal, task_id)
                self._directory.remember_task(task_id, tenant=status.tenant, is_open=status.open)
            try:
                self._directory.check_open_task(principal, task_id)
            except TaskNotOpen:
                raise TaskNotOpen(
                    "this task is a plan: it ends with its last step", task_id=task_id
                ) from None
            async with backend_errors():
                try:
                    return await asyncio.wait_for(self._tasks.close(task_id), STATUS_QUERY_TIMEOUT)
                except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
                    unanswered = await self._directory.unanswered(task_id)
                    if isinstance(unanswered, TaskUnanswered):
                        unanswered = TaskUnanswered(
                            f"{unanswered.detail}; closing again is safe",
                            retry_after_seconds=unanswered.retry_after_seconds or 2,
                        )
                    raise unanswered from None
                except CallRefused as refused:
                    raise TaskNotOpen(str(refused), task_id=task_id) from None


def derive_call_id(scope: str, idempotency_key: str) -> str:
    """The call id of a call sent without one: derived from its key (and the key's scope),
    so a resend of the same request is the same call in the task too. The key itself
    never reaches the task's history."""
    digest = hashlib.sha256(f"v1\x00{scope}\x00{idempotency_key}".encode()).hexdigest()
    return f"key-{digest[:32]}"


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
