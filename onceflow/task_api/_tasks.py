"""Starts tasks and sends decisions through Temporal's client API.

The CLI and the boundary use this; it never decides whether a request is a repeat (that
is the boundary's fingerprint check), it only starts idempotently by workflow id.
"""

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from opentelemetry import trace
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecution,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateHandle,
    WorkflowUpdateStage,
)
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from onceflow.encryption import ClearText
from onceflow.errors import CallRefused, DecisionConflict, DecisionRefused
from onceflow.plugin import UNDELIVERED_EVENTS_REFUSAL
from onceflow.task_api._listing import listed_state, state_filter
from onceflow.telemetry import current_trace_id
from onceflow.tools.worker import CATALOGUE, Catalogue
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.agent_task import TRACE_ID_MEMO
from onceflow.workflows.fairness import tenant_priority
from onceflow.workflows.task_models import (
    AgentTaskInput,
    ApproveInput,
    CallAnswer,
    CallInput,
    DecisionRecord,
    DecisionResult,
    ReconcileDecision,
    ReconcileInput,
    TaskState,
    TaskStatus,
)
from onceflow.workflows.visibility import TASK_KIND, TASK_STATE, TASK_TENANT, TASK_TOOLS


class DecisionAnswer(DecisionResult):
    """The answer to a decision: what it changed, or the same decision taken earlier."""

    replayed: bool = False
    """True when the step had already been decided exactly this way (a repeat whose
    first answer was lost): nothing new was recorded, ``decision`` is the earlier one."""
    decision: DecisionRecord | None = None
    """With ``replayed``: the earlier decision as the task recorded it."""


QUERY_ASKS = 3
"""How often a status query is sent when a worker refused it on events not yet delivered."""


@dataclass(frozen=True)
class TaskSummary:
    """One line of a task listing, from Temporal's visibility store."""

    workflow_id: str
    state: str
    tenant: str
    started_at: datetime
    kind: str = "plan"
    """``open`` (an agent's open task) or ``plan`` (fixed steps)."""
    workflow_task_attempts: int = 0
    """Attempts of its pending workflow task (from a description only): above 1, that
    workflow task failed and Temporal retries it."""


class TaskClient:
    """onceflow's operations on tasks, over one Temporal client.

    Every task and call it starts carries its tools' policies, resolved here from
    ``catalogue`` (this process's contracts and settings): the task decides from them on
    every replay, and no local activity pins them on its first workflow task.
    """

    def __init__(
        self, client: Client, *, task_queue: str, catalogue: Catalogue = CATALOGUE
    ) -> None:
        self._client = client
        self._task_queue = task_queue
        self._catalogue = catalogue

    @property
    def namespace(self) -> str:
        """The Temporal namespace the tasks live in."""
        return self._client.namespace

    async def start(
        self,
        task: AgentTaskInput,
        *,
        workflow_id: str,
        memo: Mapping[str, Any] | None = None,
        join: bool = True,
    ) -> WorkflowHandle[AgentTaskWorkflow, TaskStatus]:
        """Start the task, or attach to the task that already has this workflow id.

        A running task is joined (``USE_EXISTING``) and a closed one is never run again
        (``REJECT_DUPLICATE``): the same id always means the same task and its result.
        A plan is given its tools' policies here (``UnknownTool`` for a tool this process
        does not know: nothing is started). ``memo`` is stored only when this call starts
        the task (the boundary keeps the
        request fingerprint there, to tell a joined task's request from its own).
        ``join=False`` starts the task or raises ``WorkflowAlreadyStartedError`` when the
        id is taken, running or closed: the caller then knows without asking Temporal
        that a handle it got is of the task it started.

        The start runs in a ``StartTask`` span (a child of the caller's span, e.g. the
        gateway request's), so every task has one trace; its id goes into the memo as
        ``trace_id`` for an operator who finds the task in the Temporal UI.
        """
        # The tracer is looked up per start: the process installs its provider after import.
        with trace.get_tracer("onceflow.tasks").start_as_current_span(
            "StartTask",
            attributes={
                "onceflow.workflow_id": workflow_id,
                "onceflow.tenant": task.tenant,
                "onceflow.principal": task.principal,
                "onceflow.tools": [step.tool for step in task.steps],
            },
        ):
            trace_id = current_trace_id()
            if trace_id is not None:
                memo = {**(memo or {}), TRACE_ID_MEMO: trace_id}
            task, options = self.start_request(task, workflow_id=workflow_id, memo=memo)
            if not join:
                return await self._client.start_workflow(
                    AgentTaskWorkflow.run,
                    task,
                    **{**options, "id_conflict_policy": WorkflowIDConflictPolicy.FAIL},
                )
            try:
                return await self._client.start_workflow(AgentTaskWorkflow.run, task, **options)
            except WorkflowAlreadyStartedError:
                return self._client.get_workflow_handle_for(AgentTaskWorkflow.run, workflow_id)

    def start_request(
        self,
        task: AgentTaskInput,
        *,
        workflow_id: str,
        memo: Mapping[str, Any] | None = None,
    ) -> tuple[AgentTaskInput, dict[str, Any]]:
        """The task as ``start`` starts it (its plan's policies pinned) and the keyword
        arguments of its ``start_workflow``: for a starter that must send the start itself
        (a Nexus operation's, which attaches the operation's completion callback)."""
        task = self._pinned(task)
        if task.carried is None:
            # Its first workflow task upserts none of what the start sets (free).
            task = task.model_copy(
                update={"started_with_attributes": True, "ends_by_close_status": True}
            )
        return task, self._start_options(task, workflow_id, memo)

    def _pinned(self, task: AgentTaskInput) -> AgentTaskInput:
        """``task`` with its plan's policies when it has none yet (an open task's come
        with each call); raises ``UnknownTool`` for a tool this process does not know."""
        if task.policies is not None or task.open is not None:
            return task
        policies = self._catalogue.policies(step.tool for step in task.steps)
        return task.model_copy(update={"policies": policies})

    def _start_options(
        self, task: AgentTaskInput, workflow_id: str, memo: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        trace_id = (memo or {}).get(TRACE_ID_MEMO)
        if task.open is not None:
            what = "Open agent task"
            summary = f"{task.tenant}: open task"
        else:
            tools = ", ".join(step.tool for step in task.steps)
            what = f"Agent task, {len(task.steps)} step(s): {tools},"
            summary = f"{task.tenant}: {tools}"
        # Identifiers only, so they stay readable when payloads are encrypted (ClearText):
        # the memo holds the trace id and the request fingerprint (a digest).
        return {
            "id": workflow_id,
            "task_queue": self._task_queue,
            "id_conflict_policy": WorkflowIDConflictPolicy.USE_EXISTING,
            "id_reuse_policy": WorkflowIDReusePolicy.REJECT_DUPLICATE,
            # Queued under its tenant's fairness key: another tenant's storm on the same
            # task queue cannot hold this task's workflow tasks behind its own.
            "priority": tenant_priority(task.tenant),
            "search_attributes": TypedSearchAttributes(_start_attributes(task)),
            "static_summary": ClearText(summary),
            "static_details": ClearText(
                f"{what} of tenant `{task.tenant}` for principal `{task.principal}`."
                + (f"\n\nTrace: `{trace_id}`" if trace_id else "")
            ),
            "memo": {
                name: ClearText(value) if isinstance(value, str) else value
                for name, value in (memo or {}).items()
            }
            or None,
        }

    async def call(
        self,
        workflow_id: str,
        request: CallInput,
        *,
        start: AgentTaskInput | None = None,
        memo: Mapping[str, Any] | None = None,
    ) -> CallAnswer:
        """Send one call of an open task; the answer comes when the call ends, parks or
        awaits approval (or only when it ends, with ``request.wait_until_ended``).

        Args:
            workflow_id: The open task.
            request: The call. The same call id with the same tool and arguments is the
                same call: sending it again answers with its status.
            start: Start the open task with this input if it is not running yet
                (Update-with-Start: the task and its first call in one request).
            memo: With ``start``: the memo stored if this request starts the task.

        Raises:
            CallRefused: The task refused the call (or has ended); nothing was recorded.
            UnknownTool: This process does not know the tool; nothing was sent.
        """
        request = self._with_policy(request)
        async with _refused_calls(workflow_id):
            if start is None:
                handle = self._client.get_workflow_handle_for(AgentTaskWorkflow.run, workflow_id)
                return await handle.execute_update(AgentTaskWorkflow.call, request)
            start, options = self.start_request(start, workflow_id=workflow_id, memo=memo)
            operation = WithStartWorkflowOperation(AgentTaskWorkflow.run, start, **options)
            return await self._client.execute_update_with_start_workflow(
                AgentTaskWorkflow.call, request, start_workflow_operation=operation
            )

    async def send_call(self, workflow_id: str, request: CallInput) -> "SentCall":
        """Send one call of an open task and return once the task has taken it (recorded
        in its history, so it runs whoever waits for it); ``SentCall.answer()`` waits
        for the answer ``call`` returns. For a caller that bounds its wait for the
        answer, never the call's delivery.

        Raises:
            CallRefused: The task refused the call (or has ended); nothing was recorded.
            UnknownTool: This process does not know the tool; nothing was sent.
        """
        request = self._with_policy(request)
        handle = self._client.get_workflow_handle_for(AgentTaskWorkflow.run, workflow_id)
        async with _refused_calls(workflow_id):
            sent = await handle.start_update(
                AgentTaskWorkflow.call,
                request,
                wait_for_stage=WorkflowUpdateStage.ACCEPTED,
            )
        return SentCall(sent)

    def _with_policy(self, request: CallInput) -> CallInput:
        if request.policy is not None:
            return request
        policies = self._catalogue.policies([request.tool])
        return request.model_copy(update={"policy": policies[request.tool]})

    async def close(self, workflow_id: str) -> TaskStatus:
        """Close an open task: it takes no more calls and ends once its calls end.

        Raises:
            CallRefused: The task is a plan, or has already ended.
        """
        handle = self._client.get_workflow_handle_for(AgentTaskWorkflow.run, workflow_id)
        try:
            return await handle.execute_update(AgentTaskWorkflow.close)
        except WorkflowUpdateFailedError as failed:
            raise CallRefused(_refusal(failed), task_id=workflow_id) from None
        except RPCError as error:
            if error.status is not RPCStatusCode.NOT_FOUND:
                raise
            return await self.status(workflow_id)

    async def status(self, workflow_id: str) -> TaskStatus:
        """The task's current status (works for running and closed tasks)."""
        handle = self._client.get_workflow_handle_for(AgentTaskWorkflow.run, workflow_id)
        for _ in range(QUERY_ASKS - 1):
            try:
                return await handle.query(AgentTaskWorkflow.status)
            except WorkflowQueryFailedError as failed:
                # Refused on events the task's next workflow task delivers: asked again,
                # the query waits for that workflow task (onceflow.plugin).
                if UNDELIVERED_EVENTS_REFUSAL not in str(failed):
                    raise
        return await handle.query(AgentTaskWorkflow.status)

    async def result(self, workflow_id: str) -> TaskStatus:
        """Wait for the task to end and return its final status."""
        handle = self._client.get_workflow_handle_for(AgentTaskWorkflow.run, workflow_id)
        return await handle.result()

    async def stop_waiting(self, workflow_id: str) -> bool:
        """Tell a plan task its starter stopped waiting for it, so that it writes its
        outcome into its record itself. False when the task had already closed (left as
        it is: its starter stores its outcome)."""
        handle = self._client.get_workflow_handle_for(AgentTaskWorkflow.run, workflow_id)
        try:
            await handle.signal(AgentTaskWorkflow.starter_stopped_waiting)
        except RPCError as error:
            if error.status is not RPCStatusCode.NOT_FOUND:
                raise
            return False
        return True

    async def ended(self, workflow_id: str) -> TaskStatus:
        """The final status of a task that ended: its result, or for a workflow Temporal
        closed without one (terminated, cancelled, timed out) its last status, failed."""
        try:
            return await self.result(workflow_id)
        except WorkflowFailureError as failure:
            return await self.closed_abnormally(workflow_id, failure)

    async def closed_abnormally(
        self, workflow_id: str, failure: WorkflowFailureError
    ) -> TaskStatus:
        """A task whose workflow Temporal closed without a result: it failed as a whole."""
        last = await self.status(workflow_id)
        reason = f"the task's workflow closed without a result ({type(failure.cause).__name__})"
        return last.model_copy(update={"state": TaskState.FAILED, "failure_reason": reason})

    async def closed_among(self, workflow_ids: Sequence[str]) -> list[str]:
        """Which of these tasks have closed, from the visibility store (which may lag a
        close by a moment)."""
        if not workflow_ids:
            return []
        listed = ", ".join(f"'{_quoted(workflow_id)}'" for workflow_id in workflow_ids)
        query = f"WorkflowId IN ({listed}) AND ExecutionStatus != 'Running'"
        return [execution.id async for execution in self._client.list_workflows(query)]

    async def approve(self, workflow_id: str, decision: ApproveInput) -> DecisionAnswer:
        """Send an approval (see ``_decide`` for what a late or repeated one gets)."""
        return await self._decide(workflow_id, decision)

    async def reconcile(self, workflow_id: str, decision: ReconcileInput) -> DecisionAnswer:
        """Send a reconciliation decision (see ``_decide``)."""
        return await self._decide(workflow_id, decision)

    async def _decide(
        self, workflow_id: str, decision: ApproveInput | ReconcileInput
    ) -> DecisionAnswer:
        """Send a decision as an Update; the task is the only judge of whether it fits.

        Only when the task refuses it (its validator, or Temporal because the task has
        ended) is its status read, to tell a repeat from a conflict: the same decision
        already taken on the step (its first answer was lost) answers with that earlier
        decision, flagged ``replayed``; another one raises ``DecisionConflict``.

        Raises:
            DecisionRefused: The task refused it for another reason (wrong digest, no
                such step, the step is not there yet); nothing was recorded.
            DecisionConflict: The step was decided otherwise, or the task has ended.
        """
        handle = self._client.get_workflow_handle_for(AgentTaskWorkflow.run, workflow_id)
        try:
            if isinstance(decision, ApproveInput):
                result = await handle.execute_update(AgentTaskWorkflow.approve, decision)
            else:
                result = await handle.execute_update(AgentTaskWorkflow.reconcile, decision)
            return DecisionAnswer(**result.model_dump())
        except WorkflowUpdateFailedError as failed:
            refusal = _refusal(failed)
        except RPCError as error:
            # Temporal refuses an Update to a closed workflow: "already completed".
            if error.status is not RPCStatusCode.NOT_FOUND:
                raise
            refusal = "the task has already ended; there is nothing left to decide"
        status = await self.status(workflow_id)
        return settle_decision(status, decision, refusal=refusal)

    async def summary(self, workflow_id: str) -> TaskSummary | None:
        """What Temporal holds of a task without asking a worker (its search attributes
        and start); None when no such task exists."""
        handle = self._client.get_workflow_handle(workflow_id)
        try:
            described = await handle.describe()
        except RPCError as error:
            if error.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
                return None
            raise
        if described.workflow_type != "AgentTaskWorkflow":
            return None
        summary = _summary(described)
        pending = described.raw_description
        if pending.HasField("pending_workflow_task"):
            attempts = pending.pending_workflow_task.attempt
            summary = replace(summary, workflow_task_attempts=attempts)
        return summary

    async def memo(self, workflow_id: str) -> Mapping[str, Any] | None:
        """The memo a task was started with; None when no such task exists."""
        try:
            described = await self._client.get_workflow_handle(workflow_id).describe()
        except RPCError as error:
            if error.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
                return None
            raise
        return await described.memo()

    async def workers_polling(self) -> int:
        """How many workers Temporal saw polling the task queue lately (about the last
        minute: a worker that just died still counts for a while)."""
        described = await self._client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=self._client.namespace,
                task_queue=TaskQueue(name=self._task_queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
            )
        )
        return len(described.pollers)

    async def list(
        self,
        *,
        state: TaskState | None = None,
        tenant: str | None = None,
        open_only: bool = False,
        limit: int = 100,
    ) -> AsyncIterator[TaskSummary]:
        """Tasks from the visibility store, newest first, optionally filtered."""
        clauses = ["WorkflowType = 'AgentTaskWorkflow'"]
        if state is not None:
            clauses.append(state_filter(state))
        if tenant is not None:
            clauses.append(f"{TASK_TENANT.name} = '{_quoted(tenant)}'")
        if open_only:
            clauses.append(f"{TASK_KIND.name} = 'open'")
        async for execution in self._client.list_workflows(" AND ".join(clauses), limit=limit):
            yield _summary(execution)


def _summary(execution: WorkflowExecution) -> TaskSummary:
    attributes = execution.typed_search_attributes
    kind = attributes.get(TASK_KIND) or "plan"
    return TaskSummary(
        workflow_id=execution.id,
        state=listed_state(attributes.get(TASK_STATE), kind, execution.status),
        tenant=attributes.get(TASK_TENANT) or "",
        started_at=execution.start_time,
        kind=kind,
    )


def settle_decision(
    status: TaskStatus, decision: ApproveInput | ReconcileInput, *, refusal: str
) -> DecisionAnswer:
    """What a decision the task refused gets, judged from the task's status.

    Raises:
        DecisionConflict: The step was decided otherwise, or the task has ended.
        DecisionRefused: Otherwise, with the task's own ``refusal``.
    """
    try:
        step = status.step(decision.step_id)
    except KeyError:
        raise DecisionRefused(refusal) from None
    kind, verdict = _kind_and_verdict(decision)
    earlier = [
        record
        for record in status.decisions
        if record.accepted and record.kind == kind and record.step_id == decision.step_id
    ]
    last = earlier[-1] if earlier else None
    if last is not None and _same_decision(last, step.resource_id, decision, verdict):
        return DecisionAnswer(
            step_id=step.step_id,
            step_state=step.state,
            message=(
                f"step {step.step_id} was already decided this way ({last.decision}) by "
                f"{last.operator} at {last.at:%Y-%m-%d %H:%M:%S %Z}; nothing new was recorded"
            ),
            replayed=True,
            decision=last,
        )
    if last is None and not status.state.is_terminal:
        raise DecisionRefused(refusal)
    decided = (
        f"step {step.step_id} was decided {last.decision} by {last.operator}"
        if last is not None
        else f"step {step.step_id} is {step.state.value}"
    )
    ended = (
        f"the task has already ended ({status.state.value}); "
        if status.state.is_terminal
        else f"the task is {status.state.value}; "
    )
    raise DecisionConflict(
        f"{ended}{decided}; there is nothing left to decide"
        if status.state.is_terminal
        else f"{ended}{decided} already",
        task_state=status.state.value,
        step_state=step.state.value,
        decision=last.model_dump(mode="json") if last is not None else None,
    )


def _kind_and_verdict(decision: ApproveInput | ReconcileInput) -> tuple[str, str]:
    if isinstance(decision, ApproveInput):
        return "approve", "approve" if decision.approved else "deny"
    return "reconcile", decision.decision.value


def _same_decision(
    earlier: DecisionRecord,
    resource_id: str | None,
    decision: ApproveInput | ReconcileInput,
    verdict: str,
) -> bool:
    """The same verdict on the same arguments (who sent it does not matter: it is taken)."""
    if earlier.decision != verdict:
        return False
    if isinstance(decision, ApproveInput):
        return earlier.arguments_digest == decision.arguments_digest
    if decision.decision is ReconcileDecision.HAPPENED:
        return resource_id == decision.resource_id
    return True


@dataclass(frozen=True)
class SentCall:
    """A call an open task has taken (``TaskClient.send_call``)."""

    _update: WorkflowUpdateHandle[CallAnswer]

    async def answer(self) -> CallAnswer:
        """Wait for the call's answer: when it ends, parks or awaits approval.

        Raises:
            CallRefused: The task refused the call after taking it.
        """
        async with _refused_calls(self._update.workflow_id):
            return await self._update.result()


@asynccontextmanager
async def _refused_calls(workflow_id: str) -> AsyncIterator[None]:
    """A task's refusal of a call, or its end, as ``CallRefused``."""
    try:
        yield
    except WorkflowUpdateFailedError as failed:
        raise CallRefused(_refusal(failed), task_id=workflow_id) from None
    except RPCError as error:
        if error.status is not RPCStatusCode.NOT_FOUND:
            raise
        raise CallRefused(
            "the task has ended: it takes no more calls", task_id=workflow_id
        ) from None


def _refusal(failed: WorkflowUpdateFailedError) -> str:
    cause = failed.cause
    message = getattr(cause, "message", None) or str(cause or failed)
    return str(message)


def _start_attributes(task: AgentTaskInput) -> list[SearchAttributePair[Any]]:
    """Known before any worker runs the task: whose it is and its kind, for the gateway's
    answers and the listings while no worker serves the queue; its state (and a plan's
    tools) too when it says so, saving its first workflow task an upsert."""
    pairs: list[SearchAttributePair[Any]] = [
        SearchAttributePair(TASK_TENANT, task.tenant),
        SearchAttributePair(TASK_KIND, "open" if task.open is not None else "plan"),
    ]
    if task.started_with_attributes:
        if task.open is None:
            pairs.append(SearchAttributePair(TASK_TOOLS, task.plan_tools()))
        pairs.append(SearchAttributePair(TASK_STATE, TaskState.RUNNING.value))
    return pairs


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")
