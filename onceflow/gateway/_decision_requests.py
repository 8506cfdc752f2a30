"""Operator decisions at the boundary: approve and reconcile, as the calling principal.

A decision sent with a key is claimed like a call, in the scope of its principal and route,
with the task id in its fingerprint; the claim's owner sends the decision and stores the
task's answer (a refusal included) as the key's result, or releases the claim when no
answer came: the task keeps one decision per step, so a resend is safe where restarting a
task would not be. Without a key a decision goes straight to the task, which answers a
repeat with the decision it already took.
"""

from typing import Any

from opentelemetry import trace
from pydantic import BaseModel, ValidationError

from onceflow.errors import DecisionConflict, DecisionRefused, replayed_problem
from onceflow.gateway._backend import backend_errors
from onceflow.gateway._claims import Claims
from onceflow.gateway._fingerprint import request_fingerprint
from onceflow.gateway._principals import Principal
from onceflow.gateway._requests import (
    ApproveRequest,
    DecisionReply,
    ReconcileRequest,
    check_approver,
    check_reconciler,
    checked_optional_key,
    decision_attributes,
    invalid_request,
    parsed,
    request_scope,
)
from onceflow.gateway._task_directory import TaskDirectory
from onceflow.idempotency import IdempotencyRecord, IdempotencyStore, NewClaim, RecordState
from onceflow.task_api import DecisionAnswer, TaskClient
from onceflow.telemetry import boundary_span
from onceflow.tools.worker import derive_task_workflow_id
from onceflow.workflows.task_models import ApproveInput, ReconcileInput


class DecisionRequests:
    """Sends approve and reconcile decisions to tasks, at most once per key."""

    def __init__(
        self,
        *,
        claims: Claims,
        records: IdempotencyStore,
        tasks: TaskClient,
        directory: TaskDirectory,
    ) -> None:
        self._claims = claims
        self._records = records
        self._tasks = tasks
        self._directory = directory

    async def approve(
        self, principal: Principal, task_id: str, body: Any, idempotency_key: str | None = None
    ) -> DecisionReply:
        """``BoundaryService.approve``."""
        attributes = decision_attributes(principal, task_id, "approve", idempotency_key)
        with boundary_span("tasks.approve", attributes):
            return await self._approve(principal, task_id, body, idempotency_key)

    async def _approve(
        self, principal: Principal, task_id: str, body: Any, idempotency_key: str | None
    ) -> DecisionReply:
        check_approver(principal)
        key = checked_optional_key(idempotency_key)
        request = parsed(ApproveRequest, body)
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
        """``BoundaryService.reconcile``."""
        attributes = decision_attributes(principal, task_id, "reconcile", idempotency_key)
        with boundary_span("tasks.reconcile", attributes):
            return await self._reconcile(principal, task_id, body, idempotency_key)

    async def _reconcile(
        self, principal: Principal, task_id: str, body: Any, idempotency_key: str | None
    ) -> DecisionReply:
        check_reconciler(principal)
        key = checked_optional_key(idempotency_key)
        request = parsed(ReconcileRequest, body)
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
            raise invalid_request(invalid, location=()) from None
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
            await self._directory.task_status(principal, task_id)
            return _decision_reply(await self._decide(task_id, decision))
        scope = request_scope(principal, "task", operation)
        claim = self._claims.new(
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
        earlier = await self._claims.earlier(scope, key)
        if earlier is None:
            # Only a task of the principal's tenant can be decided; a task that is not
            # there reserves nothing. A key used before is answered from its record even
            # when the task is no longer queryable (no worker, or Temporal forgot it).
            await self._directory.task_status(principal, task_id)
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

        return await self._claims.settle(
            claim,
            target=task_id,
            doing="sending this decision",
            deadline=self._claims.reply_deadline(),
            earlier=earlier,
            owned=lambda record: self._decide_claimed(record, task_id, decision),
            finished=replayed,
        )

    async def _decide_claimed(
        self, record: IdempotencyRecord, task_id: str, decision: ApproveInput | ReconcileInput
    ) -> DecisionReply:
        async def ask() -> DecisionReply:
            return _decision_reply(await self._decide(task_id, decision))

        # A refusal or a conflict is the task's own, definitive answer.
        return await self._claims.answer_once(
            record,
            target=task_id,
            doing="deciding",
            ask=ask,
            stored=lambda reply: (200, reply.body),
            refusals=(DecisionRefused, DecisionConflict),
        )

    async def _decide(
        self, task_id: str, decision: ApproveInput | ReconcileInput
    ) -> DecisionAnswer:
        async with backend_errors():
            if isinstance(decision, ApproveInput):
                answer = await self._tasks.approve(task_id, decision)
            else:
                answer = await self._tasks.reconcile(task_id, decision)
        trace.get_current_span().set_attribute("onceflow.replayed", answer.replayed)
        return answer


def _decision_reply(answer: DecisionAnswer) -> DecisionReply:
    return DecisionReply(body=answer.model_dump(mode="json"), replayed=answer.replayed)


def _replayed_decision(record: IdempotencyRecord) -> DecisionReply:
    """The stored answer of a keyed decision: the accepted one, or its refusal raised."""
    trace.get_current_span().set_attribute("onceflow.replayed", True)
    if record.state is RecordState.SUCCEEDED:
        return DecisionReply(body=record.response_body, replayed=True)
    raise replayed_problem(record.response_body)
