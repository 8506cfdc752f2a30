"""``AgentTaskWorkflow``: one agent task, its steps run in order under one retry budget,
or an open task whose calls arrive one by one (Update ``call``) under one budget.

The workflow is the only retry owner: every activity runs with ``maximum_attempts=1``
and after each attempt the workflow asks ``retry_policy`` what to do. An unknown outcome
whose repeat is not provably safe parks the step until an operator decides.

It decides only from its pinned policy: every tool's ``ToolPolicy`` comes in the start
input (a plan) or with the tool's first call (an open task), resolved by the process
that admitted it, so a process with other settings changes new tasks, never this one. A
task started without them pins them with the local activity ``pin_task_policy``,
recorded in history (a time read right after that activity would not replay: Core may
deliver its result one workflow task later live than on replay, so the admitted path
reads none). A repeat under a key the provider forgets is checked against the key's
send window after every backoff, bounded by it while it waits for a worker, and
checked again by the attempt itself.

Open tasks share the step machinery (one workflow keeps one budget, one decision path,
one park): each call is a step run concurrently with the others; the repeat guard
answers a call identical to an earlier one that has not failed from that call; the task
continues as new (carrying the budget, the calls' outcomes and the guard) between calls,
never while one is unfinished.

Which clock each decision reads, and why it replays. ``workflow.now()`` is the start of
the workflow task being run, which history fixes, except right after a local activity
(live, Core may deliver its result one workflow task later than replay does), in a
workflow task that replay merges with an empty one before it, and, seen in chaos runs
after a Temporal restart, in a live workflow task that still reads an earlier task's
time. So a decision compares no clock where it can fire a timer instead:
- a key's send window closes when its timer fires (started with the key's first
  attempt, for ``send_window``): the retry decision, the check after a backoff and the
  new key after ``did_not_happen`` read whether it fired, an event in history; the
  attempt itself refuses to send past the window by the database's first-send time;
- an eventual look-up's miss proves absence past its lag by the activity's clock, and
  the activity's answer is in history;
- the wait for an old key's requests to settle is always a timer (its length reads
  the clock; a timer's length decides nothing);
- an open task's idle and lifetime ends are decided by a timer firing; only the
  timer's length reads the time of the last call; a call past the task's lifetime or
  deadline is refused by the validator alone (validators do not run on replay);
- the budget's deadline is machine time (less people time) at an attempt's result: the
  one comparison left with ``workflow.now()``; it flips only for a retry decided within
  a stale reading of the deadline (an hour by default).
"""

import asyncio
import contextlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
from temporalio.exceptions import TimeoutError as TemporalTimeout

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, ValidationError

    # Summaries are identifiers only: readable in the UI when payloads are encrypted.
    from onceflow.encryption import ClearText
    from onceflow.errors import OnceflowError, describe_validation
    from onceflow.retry_policy import (
        FailStep,
        OutcomeClass,
        ParkStep,
        RetryBudget,
        RetryStep,
        StepUsage,
        decide_after_attempt,
    )
    from onceflow.tools import (
        CATALOGUE,
        PIN_TASK_POLICY,
        KeyUnusable,
        PinPolicyInput,
        TaskPolicy,
        ToolAttemptResult,
        ToolCallInput,
        ToolPolicy,
        UnknownTool,
    )
    from onceflow.tools import arguments_digest as digest_arguments
    from onceflow.workflows.patches import OUTCOME_AFTER_DURABLE_DECISION
    from onceflow.workflows.task_models import (
        RECORD_TASK_OUTCOME,
        AgentTaskInput,
        ApproveInput,
        AttemptRecord,
        BudgetStatus,
        CallAnswer,
        CallInput,
        DecisionRecord,
        DecisionResult,
        ReconcileDecision,
        ReconcileInput,
        StepInput,
        StepState,
        StepStatus,
        TaskMemory,
        TaskOutcomeInput,
        TaskState,
        TaskStatus,
    )
    from onceflow.workflows.visibility import (
        TASK_KIND,
        TASK_PARKED_AT,
        TASK_STATE,
        TASK_TENANT,
        TASK_TOOLS,
    )

ONE_ATTEMPT = RetryPolicy(maximum_attempts=1)
TRACE_ID_MEMO = "trace_id"
"""Memo field with the id of the trace that started the task (set by ``TaskClient``)."""


PIN_TIMEOUT = timedelta(seconds=10)
"""Longest the local activity pinning the task's policy may run (it reads memory only)."""
MIN_TIMER = timedelta(milliseconds=1)
"""A timer for a deadline already passed: it fires at once, and its firing is recorded."""
OUTCOME_TIMEOUT = timedelta(seconds=30)
"""Longest one write of the task's outcome may take."""
ENDED_STEP_STATES = frozenset(
    {StepState.SUCCEEDED, StepState.FAILED, StepState.DENIED, StepState.ABANDONED}
)
"""States a step never leaves."""
SETTLED_STEP_STATES = ENDED_STEP_STATES | {StepState.PARKED, StepState.AWAITING_APPROVAL}
"""States a call's first answer waits for: ended, or waiting for a person."""
_RETRYABLE = frozenset({OutcomeClass.UNKNOWN, OutcomeClass.TRANSIENT})
"""Outcomes a step may repeat after (within its budget and its key's window)."""
NO_EFFECT_STEP_STATES = frozenset({StepState.FAILED, StepState.DENIED})
"""Ended with no effect: an identical later call is a new call, not a repeat."""


class ToolNotOnThisWorker(OnceflowError, RuntimeError):
    """The worker running the workflow task does not know a step's tool: retry elsewhere."""

    code = "tool-not-on-this-worker"
    title = "Tool not on this worker"


class _StepStopped(Exception):
    """The step ended without success; the task stops with the step's reason."""


@workflow.defn
class AgentTaskWorkflow:
    """Runs an agent task's tool calls in order, retrying only within its budget."""

    @workflow.init
    def __init__(self, task: AgentTaskInput) -> None:
        self._task = task
        self._budget = task.budget or RetryBudget()
        if task.carried is not None:
            # A continued open task: everything its earlier runs knew, whole.
            self._memory = task.carried.model_copy(deep=True)
            self._memory.runs += 1
        else:
            now = workflow.now()
            self._memory = TaskMemory(
                started_at=now,
                last_call_at=now,
                calls={
                    step.step_id: StepStatus(
                        step_id=step.step_id,
                        tool=step.tool,
                        arguments=step.arguments,
                        arguments_digest=digest_arguments(step.tool, step.arguments),
                    )
                    for step in task.steps
                },
            )
        # The rest is this run's own; a continued run starts it afresh (none of it is
        # about an unfinished call: a task continues as new only when none is).
        self._state = TaskState.RUNNING
        self._failure_reason: str | None = None
        self._approvals: dict[str, ApproveInput] = {}
        self._reconciliations: dict[str, ReconcileInput] = {}
        self._checking: set[str] = set()
        """Steps whose reconcile decision is being checked: others wait for the answer."""
        self._verified: dict[str, ToolAttemptResult] = {}
        """Per step: what the look-up found when it verified an accepted ``happened``."""
        self._unusable_keys: dict[str, KeyUnusable] = {}
        """Steps parked because no attempt may send under their key any more, and why."""
        self._key_windows: dict[str, _KeyWindow] = {}
        """Per running step of a tool whose provider forgets keys: its key's send window."""
        self._waiting_for_people = 0
        self._waiting_since = self._memory.started_at
        # Open tasks only.
        self._open = task.open
        self._closing: str | None = None
        self._pinning: set[str] = set()
        self._published_tools: list[str] = []
        self._calls_this_run = 0
        self._changed = False
        """Something the open task's main loop reacts to happened (a call, an end)."""
        self._call_crash: BaseException | None = None
        """What a call's coroutine raised that was not the call's own end (a worker
        without the tool, a bug): the main loop raises it, failing the workflow task."""
        self._decision_admitted_at = 0
        """History length of the workflow task that admitted the last decision Update
        (approve, reconcile, close): see ``_record_outcome``."""

    @workflow.run
    async def run(self, task: AgentTaskInput) -> TaskStatus:
        if task.open is not None:
            return await self._run_open(task)
        workflow.upsert_search_attributes(
            [
                TASK_TENANT.value_set(task.tenant),
                TASK_TOOLS.value_set(sorted({step.tool for step in task.steps})),
                TASK_STATE.value_set(self._state.value),
            ]
        )
        pinned_at = None
        if task.policies is not None:
            self._memory.policies = dict(task.policies)
        else:
            pinned_at = workflow.now()
            self._memory.policies = await self._pin_policies(sorted({s.tool for s in task.steps}))
        try:
            for step in task.steps:
                await self._run_step(step, pinned_at=pinned_at)
                pinned_at = None
            self._set_state(TaskState.SUCCEEDED)
        except _StepStopped as stopped:
            self._failure_reason = str(stopped)
            self._set_state(TaskState.FAILED)
        if task.record_outcome:
            await self._record_outcome()
        # A decision arriving as the task ends must finish before the workflow completes.
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self._status()

    # ── queries, updates and signals ────────────────────────────────────────────────

    @workflow.query
    def status(self) -> TaskStatus:
        """The task's state, every step's attempts, evidence and the budget spent."""
        return self._status()

    @workflow.update
    def approve(self, decision: ApproveInput) -> DecisionResult:
        """Approve or deny a step awaiting approval (validated before it is recorded)."""
        self._decision_admitted()
        return self._accept_approval(decision, via="update")

    @approve.validator
    def _validate_approve(self, decision: ApproveInput) -> None:
        problem = self._approval_problem(decision)
        if problem:
            raise ValueError(problem)

    @workflow.signal(name="approve")
    def approve_signal(self, decision: ApproveInput) -> None:
        """The same decision as ``approve``, for the UI; an invalid one is only recorded."""
        problem = self._approval_problem(decision)
        if problem:
            self._record_rejected(
                "approve", decision, "approve" if decision.approved else "deny", problem
            )
            return
        self._accept_approval(decision, via="signal")

    @workflow.update
    async def reconcile(self, decision: ReconcileInput) -> DecisionResult:
        """Decide a parked step: happened, did_not_happen or abandon.

        The tool's look-up checks the decision first: a refusal (the effect was found
        after all, or the named resource is not the step's) is the Update's failure, and
        nothing is recorded but the look-up's evidence.
        """
        self._decision_admitted()
        check = await self._check_reconciliation(decision)
        if check.refusal is not None:
            raise ApplicationError(check.refusal, type="DecisionRefused", non_retryable=True)
        return self._accept_reconciliation(decision, via="update", check=check)

    @reconcile.validator
    def _validate_reconcile(self, decision: ReconcileInput) -> None:
        problem = self._reconciliation_problem(decision)
        if problem:
            raise ValueError(problem)

    @workflow.signal(name="reconcile")
    async def reconcile_signal(self, decision: ReconcileInput) -> None:
        """The same decision as ``reconcile``, for the UI; an invalid one, or one its
        check refuses, is only recorded."""
        problem = self._reconciliation_problem(decision)
        if problem:
            self._record_rejected("reconcile", decision, decision.decision.value, problem)
            return
        check = await self._check_reconciliation(decision)
        if check.refusal is not None:
            self._record_rejected(
                "reconcile", decision, decision.decision.value, check.refusal, check.finding
            )
            return
        self._accept_reconciliation(decision, via="signal", check=check)

    @workflow.update
    async def call(self, request: CallInput) -> CallAnswer:
        """Run one tool call of an open task (the agent's model picked it).

        Answers when the call ends, or as soon as it parks or awaits approval (send the
        same call again with ``wait_until_ended`` to wait for the person's decision). The
        same call id with the same tool and arguments is the same call; a new call
        identical to an earlier one that has not failed is answered by that one
        (``repeat_of``) unless it is a ``deliberate_repeat``.
        """
        self._memory.last_call_at = workflow.now()
        self._changed = True
        if not self._known_call(request.call_id):
            # The validator checked the same on a live worker; replay has no validator
            # and decides again from history alone (this handler issues no command).
            problem = self._call_state_problem(request)
            if problem:
                raise ApplicationError(problem, type="CallRefused", non_retryable=True)
            if request.policy is not None:
                # Admitted with its policy: the first call of a tool pins it for the task.
                self._memory.policies.setdefault(request.tool, request.policy)
            self._accept_call(request)
        original = self._memory.calls[self._memory.repeat_of.get(request.call_id, request.call_id)]
        done = ENDED_STEP_STATES if request.wait_until_ended else SETTLED_STEP_STATES
        await workflow.wait_condition(lambda: original.state in done)
        return self._call_answer(request.call_id)

    @call.validator
    def _validate_call(self, request: CallInput) -> None:
        problem = self._call_problem(request)
        if problem:
            raise ValueError(problem)

    @workflow.update
    def close(self) -> TaskStatus:
        """Take no more calls: the task ends once its unfinished calls end."""
        self._decision_admitted()
        if self._closing is None:
            self._closing = "closed by the agent"
            self._changed = True
        return self._status()

    @close.validator
    def _validate_close(self) -> None:
        if self._open is None:
            raise ValueError("this task is a plan: it ends with its last step")

    # ── open tasks ──────────────────────────────────────────────────────────────────

    async def _run_open(self, task: AgentTaskInput) -> TaskStatus:
        options = task.open
        assert options is not None
        self._state = self._open_state()
        self._published_tools = sorted({call.tool for call in self._memory.calls.values()})
        workflow.upsert_search_attributes(
            [
                TASK_TENANT.value_set(task.tenant),
                TASK_KIND.value_set("open"),
                TASK_STATE.value_set(self._state.value),
                *([TASK_TOOLS.value_set(self._published_tools)] if self._published_tools else []),
            ]
        )
        lifetime_ends = self._memory.started_at + options.max_lifetime
        while True:
            if self._call_crash is not None:
                # Visible in the UI and retried by Temporal (on a worker with the tool, or
                # after a fix); never a call left running with its Update unanswered.
                raise self._call_crash
            self._changed = False
            self._publish_state(self._open_state())
            workflow.set_current_details(self._open_details())
            unfinished = self._unfinished_calls()
            if self._closing is not None and not unfinished:
                break
            if self._closing is None and not unfinished and self._should_continue_as_new():
                await workflow.wait_condition(workflow.all_handlers_finished)
                if not self._unfinished_calls() and not self._changed:
                    workflow.continue_as_new(self._carried(task))
                continue
            # Idle and lifetime ends are decided by a timer firing (in history), never by
            # comparing clocks here: a replay whose workflow tasks merged reads other
            # times. A timer only while nothing runs: a call in flight keeps the task
            # from idling, and the validator refuses calls past the lifetime, so a busy
            # task adds no timer per call.
            if unfinished or self._closing is not None:
                await workflow.wait_condition(lambda: self._changed)
                continue
            idle_ends = self._memory.last_call_at + options.idle_timeout
            try:
                await workflow.wait_condition(
                    lambda: self._changed,
                    timeout=max(min(lifetime_ends, idle_ends) - workflow.now(), MIN_TIMER),
                    timeout_summary=ClearText("idle timeout or maximum lifetime"),
                )
            except TimeoutError:
                if not self._changed and not self._unfinished_calls():
                    self._closing = (
                        f"its maximum lifetime ({options.max_lifetime}) ended"
                        if lifetime_ends <= idle_ends
                        else f"idle for {options.idle_timeout}"
                    )
        self._publish_state(TaskState.CLOSED)
        workflow.set_current_details(self._open_details())
        if task.record_outcome:
            await self._record_outcome()
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self._status()

    def _call_problem(self, request: CallInput) -> str | None:
        """Why a call cannot run, checked by the validator before anything is written;
        None if it can. Validators never run on replay: this is the one place a call's
        arguments meet this worker's input model."""
        problem = self._call_state_problem(request, live=True)
        if problem is not None or self._known_call(request.call_id):
            return problem
        if request.policy is not None and request.policy.tool != request.tool:
            return f"the call carries tool {request.policy.tool!r}'s policy, not {request.tool!r}'s"
        try:
            CATALOGUE.get(request.tool).input_model.model_validate(request.arguments)
        except UnknownTool as unknown:
            return str(unknown)
        except ValidationError as invalid:
            return f"invalid arguments: {describe_validation(invalid, whole='arguments')}"
        return None

    def _call_state_problem(self, request: CallInput, *, live: bool = False) -> str | None:
        """Why the task's state refuses a call, from history alone (the pinned policy,
        the calls so far): what the handler checks again, on every replay too. Only
        ``live`` (the validator) asks this worker's contract and compares clocks (the
        lifetime, the deadline): the handler runs in the validator's activation, so it
        would decide the same live, and a replay, which has no validator, might read
        another time."""
        if self._open is None:
            return "this task is a plan: its steps were given when it started"
        if self._known_call(request.call_id):
            original = self._call_status(request.call_id)
            if original.tool != request.tool or original.arguments_digest != digest_arguments(
                request.tool, request.arguments
            ):
                return (
                    f"call id {request.call_id!r} was used for another call "
                    f"({original.tool} with arguments {original.arguments_digest}) in this task"
                )
            return None  # the same call again: answered with its status
        if self._closing is not None:
            return f"the task takes no more calls: {self._closing}"
        if live and workflow.now() >= self._memory.started_at + self._open.max_lifetime:
            return f"the task's maximum lifetime ({self._open.max_lifetime}) has ended"
        allowed = self._open.allowed_tools
        if allowed is not None and request.tool not in allowed:
            return f"tool {request.tool!r} is not allowed in this task"
        if request.deliberate_repeat and not self._allows_deliberate_repeats(request, live=live):
            return (
                f"tool {request.tool!r} does not allow deliberate repeats: an identical "
                "earlier call answers this one"
            )
        budget = self._budget
        if self._memory.budgeted_attempts >= budget.max_attempts_per_task:
            return (
                f"the task's retry budget is spent ({self._memory.budgeted_attempts} of "
                f"{budget.max_attempts_per_task} attempts used)"
            )
        used = workflow.now() - self._memory.started_at - self._people_time()
        if live and used >= budget.deadline:
            return f"the task's deadline ({budget.deadline} of machine time) has passed"
        return None

    def _allows_deliberate_repeats(self, request: CallInput, *, live: bool = False) -> bool:
        """From the pinned policy, or the call's. A call admitted without one, of a tool
        not pinned yet, is checked against this worker's contract only ``live`` (by the
        validator) and again by its coroutine once the tool is pinned."""
        policy = self._memory.policies.get(request.tool) or request.policy
        if policy is not None:
            return policy.deliberate_repeats
        if not live:
            return True
        try:
            return CATALOGUE.get(request.tool).deliberate_repeats
        except UnknownTool:
            return False

    def _accept_call(self, request: CallInput) -> None:
        digest = digest_arguments(request.tool, request.arguments)
        earlier = None if request.deliberate_repeat else self._identical_call(digest)
        status = StepStatus(
            step_id=request.call_id,
            tool=request.tool,
            arguments=request.arguments,
            arguments_digest=digest,
            deliberate_repeat=request.deliberate_repeat,
        )
        self._memory.order.append(request.call_id)
        if earlier is not None:
            _count("onceflow_repeats_answered", tool=request.tool)
            self._memory.repeat_of[request.call_id] = earlier.step_id
            return
        self._memory.calls[request.call_id] = status
        self._calls_this_run += 1
        step = StepInput(step_id=request.call_id, tool=request.tool, arguments=request.arguments)
        asyncio.create_task(self._run_call(step))

    def _identical_call(self, digest: str) -> StepStatus | None:
        """The earliest call with the same tool and arguments that has not ended with
        no effect: the one a repeat is answered by."""
        for call in self._memory.calls.values():
            if call.arguments_digest == digest and call.state not in NO_EFFECT_STEP_STATES:
                return call
        return None

    async def _run_call(self, step: StepInput) -> None:
        """Run one call to its end. Commands start here, in the call's coroutine, never
        in the Update handler: a handler's commands interleave with other Updates'
        acceptances in an order replay does not reproduce."""
        in_workflow = True
        try:
            pinned_at = None
            if step.tool not in self._memory.policies:
                pinned_at = workflow.now()
                await self._pin_tool(step.tool)
            status = self._memory.calls[step.step_id]
            if status.deliberate_repeat and not self._policy(step.tool).deliberate_repeats:
                self._stop_step(
                    status,
                    StepState.FAILED,
                    f"tool {step.tool!r} does not allow deliberate repeats: an identical "
                    "earlier call answers this one",
                )
            await self._run_step(step, pinned_at=pinned_at)
        except _StepStopped:
            pass  # the call's own state says how it ended; the task goes on
        except Exception as crash:
            self._call_crash = crash
        except GeneratorExit:
            # Closed by the garbage collector after the task left the worker's cache: no
            # longer in the workflow's event loop, where workflow.now() would raise.
            in_workflow = False
            raise
        finally:
            if in_workflow:
                # Idle counts from the last call's end too: a call a person decided after
                # a long wait does not leave the agent's next call to a closed task.
                self._memory.last_call_at = workflow.now()
                self._changed = True

    async def _pin_tool(self, tool: str) -> None:
        """Pin a tool's policy the first time a call uses it (recorded in history)."""
        if tool in self._memory.policies:
            return
        if tool in self._pinning:
            await workflow.wait_condition(lambda: tool in self._memory.policies)
            return
        self._pinning.add(tool)
        try:
            for name, policy in (await self._pin_policies([tool])).items():
                self._memory.policies.setdefault(name, policy)  # an admitted call's came first
        finally:
            self._pinning.discard(tool)

    def _known_call(self, call_id: str) -> bool:
        return call_id in self._memory.calls or call_id in self._memory.repeat_of

    def _unfinished_calls(self) -> list[StepStatus]:
        return [call for call in self._memory.calls.values() if call.state not in ENDED_STEP_STATES]

    def _open_state(self) -> TaskState:
        states = {call.state for call in self._unfinished_calls()}
        if StepState.PARKED in states:
            return TaskState.PARKED
        if StepState.AWAITING_APPROVAL in states:
            return TaskState.AWAITING_APPROVAL
        return TaskState.RUNNING

    def _should_continue_as_new(self) -> bool:
        assert self._open is not None
        per_run = self._open.calls_per_run
        if per_run is not None and self._calls_this_run >= per_run:
            return True
        return workflow.info().is_continue_as_new_suggested()

    def _carried(self, task: AgentTaskInput) -> AgentTaskInput:
        return task.model_copy(update={"carried": self._memory.for_next_run()})

    def _call_answer(self, call_id: str) -> CallAnswer:
        repeat_of = self._memory.repeat_of.get(call_id)
        return CallAnswer(
            task_id=workflow.info().workflow_id,
            task_state=self._open_state() if self._state is not TaskState.CLOSED else self._state,
            call=self._call_status(call_id),
            repeat_of=repeat_of,
        )

    def _call_status(self, call_id: str) -> StepStatus:
        repeat_of = self._memory.repeat_of.get(call_id)
        if repeat_of is None:
            return self._memory.calls[call_id]
        return self._memory.calls[repeat_of].model_copy(
            update={"step_id": call_id, "attempts": [], "repeat_of": repeat_of}
        )

    def _calls_summary(self) -> str:
        lines = [
            f"- {call.step_id}: {call.tool} {call.state.value}"
            + (f" (repeat of {self._memory.repeat_of[call.step_id]})" if call.repeat_of else "")
            for call in (self._call_status(call_id) for call_id in self._call_order())
        ]
        return f"Open task: {len(lines)} calls" + ("\n" + "\n".join(lines[-20:]) if lines else "")

    def _call_order(self) -> list[str]:
        return self._memory.order

    # ── application logic ───────────────────────────────────────────────────────────

    async def _run_step(self, step: StepInput, *, pinned_at: datetime | None = None) -> None:
        """Run one step to its end (or until it parks for good), then stop its key
        window's timer: it matters only while the step may still send."""
        try:
            await self._run_step_attempts(step, pinned_at=pinned_at)
        except GeneratorExit:
            raise  # closed outside the workflow's event loop (evicted): nothing to stop
        except BaseException:
            self._stop_key_window(step.step_id)
            raise
        self._stop_key_window(step.step_id)

    async def _run_step_attempts(self, step: StepInput, *, pinned_at: datetime | None) -> None:
        """Attempt the step until it succeeds, stops, or an operator ends it.

        Decides from history alone: the pinned policy and the arguments as recorded (the
        approval threshold reads them; the attempt validates them with the tool's input
        model and records a rejection as its outcome), never from this worker's input
        model, so a worker whose model changed still replays and finishes old tasks.

        ``pinned_at``: the time before a local activity pinned the step's policy, when
        the step runs right after it. A clock read there would not replay (Core may
        deliver the activity's result a workflow task later live than on replay), so
        the first attempt's start, or the wait for approval, counts from it instead.
        """
        status = self._memory.calls[step.step_id]
        self._require_tool(step)
        policy = self._policy(step.tool)
        if policy.needs_approval(step.arguments):
            await self._await_approval(status, now=pinned_at)
            pinned_at = None
        operator_authorised = False
        saw_unknown = False
        reserved = False
        while True:
            result = await self._attempt(
                step, policy, status, operator_authorised, started_at=pinned_at, reserved=reserved
            )
            pinned_at, reserved = None, False
            if result.outcome is OutcomeClass.SUCCEEDED:
                self._finish_step(status, result.resource_id, result.result)
                return
            saw_unknown = saw_unknown or result.outcome is OutcomeClass.UNKNOWN
            operator_authorised = False
            closed = self._key_window_closed(policy, status)
            if closed is not None and result.key_unusable is None and result.outcome in _RETRYABLE:
                # The window's timer fired before the attempt's end reached the workflow.
                last = f" (last attempt: {result.reason})" if result.reason else ""
                result = result.model_copy(
                    update={"key_unusable": KeyUnusable.SEND_BY_PASSED, "reason": closed + last}
                )
            if result.key_unusable is not None:
                # No attempt may send under this key any more, whatever the budget says.
                _count("onceflow_key_unusable", tool=step.tool, why=result.key_unusable.value)
                reason = result.reason or f"the step's key is unusable ({result.key_unusable})"
                if await self._look_up_or_park(
                    step, policy, status, reason, key_unusable=result.key_unusable
                ):
                    return
                operator_authorised, saw_unknown = True, False
                continue
            decision = decide_after_attempt(
                self._budget,
                result.outcome,
                self._usage(status, saw_unknown),
                safe_repeat_window=self._safe_repeat_window(policy, status),
                random_fraction=workflow.random().random,
            )
            if not isinstance(decision, RetryStep) and decision.budget_exhausted:
                _count("onceflow_budget_exhausted", tool=step.tool, then=decision.kind)
            if isinstance(decision, RetryStep):
                # The retry takes its place in the task-wide budget now, not when it is
                # made: calls running side by side decide one at a time, each seeing the
                # retries the others have decided, so N calls spend at most N + B.
                self._memory.budgeted_attempts += 1
                reserved = True
                status.state = StepState.BACKING_OFF
                # The backoff ends early when the key's window closes meanwhile: the
                # step then looks up and parks at once rather than after the backoff.
                with contextlib.suppress(TimeoutError):
                    await workflow.wait_condition(
                        lambda: not self._key_window_open(status),
                        timeout=decision.delay,
                        timeout_summary=ClearText(f"backoff before retrying step {step.step_id}"),
                    )
                closed = self._key_window_closed(policy, status)
                if closed is not None:
                    self._memory.budgeted_attempts -= 1  # the reserved retry is not made
                    reserved = False
                    # The key's window closed during the backoff (its timer fired first).
                    if await self._look_up_or_park(
                        step, policy, status, closed, key_unusable=KeyUnusable.SEND_BY_PASSED
                    ):
                        return
                    operator_authorised, saw_unknown = True, False
            elif isinstance(decision, FailStep):
                last = f" (last attempt: {result.reason})" if result.reason else ""
                self._stop_step(
                    status, StepState.FAILED, f"step {step.step_id}: {decision.reason}{last}"
                )
            elif isinstance(decision, ParkStep):
                if await self._look_up_or_park(step, policy, status, decision.reason):
                    return
                operator_authorised, saw_unknown = True, False

    async def _look_up_or_park(
        self,
        step: StepInput,
        policy: ToolPolicy,
        status: StepStatus,
        reason: str,
        *,
        key_unusable: KeyUnusable | None = None,
    ) -> bool:
        """Look the effect up, else park: True when the step finished (found, or an
        operator found it happened); False when an operator authorised another attempt
        (under the next key generation if the old key can no longer be sent)."""
        found = await self._look_up(step, policy, status)
        if found is not None:
            status.evidence["looked_up_because"] = reason
            self._finish_step(status, found.resource_id, found.result)
            return True
        if key_unusable is not None:
            self._unusable_keys[status.step_id] = key_unusable
            self._stop_key_window(status.step_id)  # the key is done with: no timer waits
        finding = await self._park(status, reason)
        new_key = self._old_key_unusable(status)
        why_unusable = self._unusable_keys.pop(status.step_id, None)
        if finding.decision is ReconcileDecision.DID_NOT_HAPPEN and new_key:
            # Sending the old key again could not make progress (the provider replays
            # its stored failure) or could make a second effect (it may have forgotten
            # the key): the operator's attempt goes out under a new key.
            if why_unusable is not KeyUnusable.STORED_FAILURE:
                # A stored failure proves the provider finished with the old key; past
                # its send-by, its last request may still be held there and commit.
                late = await self._old_key_settled(step, policy, status)
                if late is not None:
                    status.evidence["found_after_decision"] = "true"
                    self._finish_step(status, late.resource_id, late.result)
                    return True
            self._stop_key_window(status.step_id)
            status.key_generation += 1
            status.evidence["key_generation"] = str(status.key_generation)
        if finding.decision is ReconcileDecision.HAPPENED:
            verified = self._verified.pop(status.step_id, None)
            result = {**verified.result, "reconciled": True} if verified else {"reconciled": True}
            self._finish_step(status, finding.resource_id, result)
            return True
        if finding.decision is ReconcileDecision.ABANDON:
            self._stop_step(
                status,
                StepState.ABANDONED,
                f"step {step.step_id} abandoned by {finding.operator}: {finding.reason}",
            )
        return False

    async def _old_key_settled(
        self, step: StepInput, policy: ToolPolicy, status: StepStatus
    ) -> ToolAttemptResult | None:
        """Wait until no request under the step's current key can still take effect at
        the provider (its last attempt's end + the policy's settle time), then look the
        effect up again: what it finds is the step's (the operator's look came too early)."""
        generation = status.key_generation
        ended = [a.finished_at for a in status.attempts if a.key_generation == generation]
        if not ended:
            return None
        settled_at = max(ended) + policy.settle_time
        status.state = StepState.BACKING_OFF
        status.evidence["old_key_settles_at"] = settled_at.isoformat()
        # Always a timer, however little is left: whether any is left reads the clock,
        # which a replay may read otherwise; the timer's length is no decision.
        await workflow.sleep(
            max(settled_at - workflow.now(), MIN_TIMER),
            summary=ClearText(
                f"let step {step.step_id}'s last request under its old key settle at "
                "the provider before a new key is sent"
            ),
        )
        return await self._look_up(
            step, policy, status, why="once the old key's requests have settled"
        )

    async def _pin_policies(self, tools: list[str]) -> dict[str, ToolPolicy]:
        """Resolve the tools' policies once (a plan's in its first workflow task, an open
        task's as calls bring them): Temporal records the local activity's answer, and
        every replay reads it from history."""
        try:
            pinned: TaskPolicy = await workflow.execute_local_activity(
                PIN_TASK_POLICY,
                PinPolicyInput(tools=tools),
                result_type=TaskPolicy,
                start_to_close_timeout=PIN_TIMEOUT,
                retry_policy=ONE_ATTEMPT,
                summary=ClearText("pin the task's policy"),
            )
        except (ActivityError, ApplicationError) as failure:
            # A local activity's failure may arrive unwrapped.
            cause = failure.cause if isinstance(failure, ActivityError) else failure
            if isinstance(cause, ApplicationError) and cause.type == "ToolNotOnThisWorker":
                # Fail the workflow task (Temporal retries it) until a worker with the
                # tool pins the policy; nothing is recorded, nothing fails for good.
                raise ToolNotOnThisWorker(cause.message) from None
            raise ToolNotOnThisWorker(
                f"this worker could not pin the task's policy ({type(cause).__name__}: "
                f"{cause}); build workers with onceflow.worker.build_worker, which "
                "registers pin_task_policy"
            ) from None
        return dict(pinned.tools)

    def _policy(self, tool: str) -> ToolPolicy:
        return self._memory.policies[tool]  # pinned before any of its steps runs

    def _send_by(self, policy: ToolPolicy, status: StepStatus) -> datetime | None:
        """The step key's send-by deadline in workflow time, if the provider forgets keys:
        for messages and the attempt's schedule-to-start limit only, never a decision
        (the key window's timer decides).

        Counted from the start of the key generation's first attempt, which is no later
        than the key's first send: earlier than the attempt's own check (the recorded
        first send), never later.
        """
        first = self._first_attempt_of_key(status)
        if first is None:
            return None
        return policy.send_by(first.started_at)

    def _open_key_window(self, policy: ToolPolicy, status: StepStatus) -> None:
        """Start the key's window timer with its first attempt: the window closes when it
        fires (an event in history), so every decision about the window replays. It is
        started before the attempt can send, so it closes no later than the attempt's
        own check (against the database's first-send time) refuses to send."""
        window = policy.send_window
        current = self._key_windows.get(status.step_id)
        if window is None or (current is not None and current.generation == status.key_generation):
            return
        self._stop_key_window(status.step_id)
        self._key_windows[status.step_id] = _KeyWindow(
            generation=status.key_generation,
            timer=asyncio.create_task(
                workflow.sleep(
                    window,
                    summary=ClearText(f"send window of step {status.step_id}'s key"),
                )
            ),
        )

    def _stop_key_window(self, step_id: str) -> None:
        window = self._key_windows.pop(step_id, None)
        if window is not None and not window.timer.done():
            window.timer.cancel()

    def _key_window_open(self, status: StepStatus) -> bool:
        """False once the window timer of the step's current key fired."""
        window = self._key_windows.get(status.step_id)
        return not (
            window is not None
            and window.generation == status.key_generation
            and window.timer.done()
            and not window.timer.cancelled()
        )

    def _safe_repeat_window(self, policy: ToolPolicy, status: StepStatus) -> timedelta | None:
        """The policy's safe repeat window, from the key window's timer: nothing left once
        it fired, else at most the whole window (a retry whose backoff outlasts what is
        left finds the timer fired after it, and looks up instead of sending)."""
        key_age = timedelta(0)
        if not self._key_window_open(status) and policy.send_window is not None:
            key_age = policy.send_window
        return policy.safe_repeat_window(key_age)

    def _old_key_unusable(self, status: StepStatus) -> bool:
        """Whether the step's current key can no longer be sent: an attempt said so, or
        its window closed (while the step waited for a person, say)."""
        if status.step_id in self._unusable_keys:
            return True
        return self._key_window_closed(self._policy(status.tool), status) is not None

    def _key_window_closed(self, policy: ToolPolicy, status: StepStatus) -> str | None:
        """Why nothing may be sent under the step's key any more, once its window closed."""
        if self._key_window_open(status):
            return None
        send_by = self._send_by(policy, status)
        when = f", about {send_by.isoformat(timespec='seconds')}" if send_by is not None else ""
        return (
            f"the send window of the step's key closed (first attempt + retention "
            f"{policy.key_retention} - margin {policy.retention_margin}{when}): the provider "
            "may have forgotten the key, so nothing more is sent under it"
        )

    def _require_tool(self, step: StepInput) -> None:
        """Fail the workflow task while this worker lacks the step's tool: Temporal
        retries it (the UI shows why) until a worker with the tool takes it. Always, on
        every replay too: a failed workflow task records nothing, so nothing can differ."""
        if step.tool not in CATALOGUE:
            raise ToolNotOnThisWorker(
                f"tool {step.tool!r} is not registered on this worker; load it on every "
                "worker of the task queue (ONCEFLOW_TOOLS)"
            )

    async def _attempt(
        self,
        step: StepInput,
        policy: ToolPolicy,
        status: StepStatus,
        operator_authorised: bool,
        *,
        started_at: datetime | None = None,
        reserved: bool = False,
    ) -> ToolAttemptResult:
        """Make one attempt and record it. ``reserved``: a retry whose place in the
        task-wide budget was taken when it was decided."""
        attempt = len(status.attempts) + 1
        status.state = StepState.RUNNING
        started_at = started_at or workflow.now()
        # A repeat under a key the provider forgets must start before the key's send-by
        # deadline: a stopped or backlogged worker must not pick it up later.
        self._open_key_window(policy, status)
        send_by = None if operator_authorised else self._send_by(policy, status)
        wait_for_worker = (
            max(send_by - started_at, timedelta(seconds=1)) if send_by is not None else None
        )
        call = ToolCallInput(
            tenant=self._task.tenant,
            principal=self._task.principal,
            workflow_id=workflow.info().workflow_id,
            step_id=step.step_id,
            tool=step.tool,
            arguments=step.arguments,
            attempt=attempt,
            evidence=status.evidence,
            policy=self._memory.policies.get(step.tool),
            key_generation=status.key_generation,
        )
        try:
            result: ToolAttemptResult = await workflow.execute_activity(
                step.tool,
                call,
                result_type=ToolAttemptResult,
                start_to_close_timeout=policy.attempt_timeout,
                schedule_to_start_timeout=wait_for_worker,
                heartbeat_timeout=policy.heartbeat_timeout,
                retry_policy=ONE_ATTEMPT,
                summary=ClearText(f"{step.tool} · step {step.step_id} · attempt {attempt}"),
            )
        except ActivityError as failure:
            result = ToolAttemptResult(
                outcome=OutcomeClass.UNKNOWN, reason=_describe_activity_failure(failure)
            )
            if send_by is not None and _not_started_in_time(failure):
                result = ToolAttemptResult(
                    outcome=OutcomeClass.TRANSIENT,
                    reason=(
                        "no worker started the attempt before the send-by deadline of the "
                        f"step's key ({send_by.isoformat(timespec='seconds')}), so nothing "
                        "was sent: the provider may have forgotten the key"
                    ),
                    key_unusable=KeyUnusable.SEND_BY_PASSED,
                )
            elif _not_registered(failure):
                result = ToolAttemptResult(
                    outcome=OutcomeClass.TRANSIENT,
                    reason=(
                        f"the worker that took the attempt has no tool {step.tool!r}, so "
                        "nothing ran; load it on every worker of the task queue (ONCEFLOW_TOOLS)"
                    ),
                )
        _count("onceflow_attempts", tool=step.tool, outcome=result.outcome.value)
        waited_for_database = result.database_unavailable
        if operator_authorised:
            self._memory.operator_authorised_attempts += 1
        elif reserved:
            if waited_for_database:
                self._memory.budgeted_attempts -= 1  # an outage's attempt is free: give it back
        elif not waited_for_database and (self._open is None or attempt > 1):
            # An open task's calls are as many as the model makes: only their retries
            # spend the task's attempts.
            self._memory.budgeted_attempts += 1
        status.attempts.append(
            AttemptRecord(
                attempt=attempt,
                outcome=result.outcome,
                started_at=started_at,
                finished_at=workflow.now(),
                operator_authorised=operator_authorised,
                reason=result.reason,
                evidence=result.evidence,
                key_generation=status.key_generation,
                database_unavailable=waited_for_database,
            )
        )
        status.evidence.update(result.evidence)
        return result

    async def _look_up(
        self,
        step: StepInput,
        policy: ToolPolicy,
        status: StepStatus,
        *,
        claimed_resource_id: str | None = None,
        accept_unverified: bool = False,
        why: str = "before parking",
    ) -> ToolAttemptResult | None:
        """Ask the provider (strongly consistent reads first) if it happened: before
        parking, or to check an operator's decision (``claimed_resource_id``: the
        resource an operator says the step made). The effect found, or None."""
        answer = await self._ask_look_up(
            step,
            policy,
            status,
            claimed_resource_id=claimed_resource_id,
            accept_unverified=accept_unverified,
            why=why,
        )
        return answer if answer is not None and answer.outcome is OutcomeClass.SUCCEEDED else None

    async def _ask_look_up(
        self,
        step: StepInput,
        policy: ToolPolicy,
        status: StepStatus,
        *,
        claimed_resource_id: str | None = None,
        accept_unverified: bool = False,
        why: str,
    ) -> ToolAttemptResult | None:
        """The look-up's answer (a miss too, saying what it proves), or None when the
        tool has no look-up or it could not run."""
        if policy.lookup_activity is None:
            return None
        call = ToolCallInput(
            tenant=self._task.tenant,
            principal=self._task.principal,
            workflow_id=workflow.info().workflow_id,
            step_id=step.step_id,
            tool=step.tool,
            arguments=step.arguments,
            attempt=len(status.attempts),
            evidence=status.evidence,
            policy=self._memory.policies.get(step.tool),
            key_generation=status.key_generation,
            claimed_resource_id=claimed_resource_id,
            accept_unverified=accept_unverified,
            last_attempt_ended_at=status.attempts[-1].finished_at if status.attempts else None,
        )
        try:
            found: ToolAttemptResult = await workflow.execute_activity(
                policy.lookup_activity,
                call,
                result_type=ToolAttemptResult,
                start_to_close_timeout=policy.attempt_timeout,
                retry_policy=ONE_ATTEMPT,
                summary=ClearText(f"look up step {step.step_id}'s effect {why}"),
            )
        except ActivityError as failure:
            status.evidence["lookup"] = _describe_activity_failure(failure)
            return None
        status.evidence.update(found.evidence)
        if found.outcome is not OutcomeClass.SUCCEEDED:
            status.evidence["lookup"] = found.reason or "inconclusive"
        return found

    def _decision_admitted(self) -> None:
        self._decision_admitted_at = workflow.info().get_current_history_length()

    async def _record_outcome(self) -> None:
        # The record is the boundary's answer to repeats. Writing it is an idempotent
        # local update, so the workflow (still the only retry owner) tries a few times;
        # if all fail, the boundary falls back to asking the workflow itself.
        if (
            self._decision_admitted_at == workflow.info().get_current_history_length()
            and workflow.patched(OUTCOME_AFTER_DURABLE_DECISION)
        ):
            # The Update that ended the task came in this workflow task, which is not in
            # history until it completes: a worker lost before that, and a Temporal
            # restart that forgets the Update, would leave a record of an end the task
            # never reached (it still awaits the decision). A timer makes the decision
            # durable first; the local activity then runs in the next workflow task.
            await workflow.sleep(MIN_TIMER, summary=ClearText("make the decision durable"))
        outcome = TaskOutcomeInput(workflow_id=workflow.info().workflow_id, status=self._status())
        summary = ClearText("record the task's result for repeated requests")
        for attempt in range(1, 6):
            try:
                # One short write on the worker that ends the task: no activity task and
                # no further workflow task on the way to the task's end.
                await workflow.execute_local_activity(
                    RECORD_TASK_OUTCOME,
                    outcome,
                    start_to_close_timeout=OUTCOME_TIMEOUT,
                    retry_policy=ONE_ATTEMPT,
                    summary=summary,
                )
                return
            except (ActivityError, ApplicationError) as failure:
                # A local activity's failure may arrive unwrapped.
                workflow.logger.warning(
                    "recording the task outcome failed (attempt %d): %s",
                    attempt,
                    _describe_activity_failure(failure)
                    if isinstance(failure, ActivityError)
                    else f"the activity raised {failure.type or 'an error'}: {failure.message}",
                )
                await workflow.sleep(timedelta(seconds=2**attempt))

    # ── approval and parking plumbing ───────────────────────────────────────────────

    async def _await_approval(self, status: StepStatus, *, now: datetime | None = None) -> None:
        status.state = StepState.AWAITING_APPROVAL
        self._set_state(TaskState.AWAITING_APPROVAL)
        self._show_details(_approval_details(status))
        self._begin_waiting_for_people(now)
        await workflow.wait_condition(lambda: status.step_id in self._approvals)
        self._end_waiting_for_people()
        approval = self._approvals[status.step_id]
        self._show_details("")
        if not approval.approved:
            self._stop_step(
                status,
                StepState.DENIED,
                f"step {status.step_id} denied by {approval.approver}: {approval.reason}",
            )
        self._set_state(TaskState.RUNNING)

    async def _park(self, status: StepStatus, reason: str) -> ReconcileInput:
        workflow_id = workflow.info().workflow_id
        status.state = StepState.PARKED
        status.park_reason = reason
        status.reconcile_command = (
            f"onceflow reconcile {workflow_id} --step {status.step_id} "
            "--decision happened|did_not_happen|abandon [--resource-id ID] --reason TEXT"
        )
        self._set_state(TaskState.PARKED)
        _count("onceflow_tasks_parked", tool=status.tool)
        self._show_details(_park_details(status))
        self._begin_waiting_for_people()
        await workflow.wait_condition(lambda: status.step_id in self._reconciliations)
        self._end_waiting_for_people()
        finding = self._reconciliations.pop(status.step_id)
        # Decided: no longer parked, even while a look-up or a settle wait follows.
        status.state = StepState.RUNNING
        status.park_reason = None
        status.reconcile_command = None
        self._show_details("")
        self._set_state(TaskState.RUNNING)
        return finding

    def _begin_waiting_for_people(self, now: datetime | None = None) -> None:
        # Calls of an open task may wait side by side: people time is the time at least
        # one of them waits, counted once.
        if self._waiting_for_people == 0:
            self._waiting_since = now or workflow.now()
        self._waiting_for_people += 1

    def _end_waiting_for_people(self) -> None:
        self._waiting_for_people -= 1
        if self._waiting_for_people == 0:
            self._memory.waited_for_people += workflow.now() - self._waiting_since

    def _show_details(self, details: str) -> None:
        """The Temporal UI's current details: a plan's waiting step; an open task's
        calls and every waiting one (its loop composes them)."""
        if self._open is None:
            workflow.set_current_details(details)

    def _open_details(self) -> str:
        waiting = [
            _park_details(call) if call.state is StepState.PARKED else _approval_details(call)
            for call in self._memory.calls.values()
            if call.state in (StepState.PARKED, StepState.AWAITING_APPROVAL)
        ]
        return "\n\n".join([self._calls_summary(), *waiting])

    def _approval_problem(self, decision: ApproveInput) -> str | None:
        status = self._memory.calls.get(decision.step_id)
        if status is None:
            return f"this task has no step {decision.step_id!r}"
        if status.state is not StepState.AWAITING_APPROVAL or decision.step_id in self._approvals:
            return (
                f"step {decision.step_id!r} is not awaiting approval (it is {status.state.value})"
            )
        if decision.arguments_digest != status.arguments_digest:
            return (
                f"the approval is for other arguments: step {decision.step_id!r} has "
                f"{status.arguments_digest}, the approval names {decision.arguments_digest}"
            )
        return None

    def _reconciliation_problem(self, decision: ReconcileInput) -> str | None:
        status = self._memory.calls.get(decision.step_id)
        if status is None:
            return f"this task has no step {decision.step_id!r}"
        if status.state is not StepState.PARKED or decision.step_id in self._reconciliations:
            return f"step {decision.step_id!r} is not parked (it is {status.state.value})"
        if decision.step_id in self._checking:
            return (
                f"another decision on step {decision.step_id!r} is being checked with the "
                "tool's look-up; send yours again once it is answered"
            )
        return None

    async def _check_reconciliation(self, decision: ReconcileInput) -> "_DecisionCheck":
        """Check a decision against the provider before it acts (invariant 16).

        ``did_not_happen`` runs the look-up and is refused when it finds the effect;
        ``happened`` is verified by a look-up that verifies resource ids, which also
        records the resource in the step's operation record (a later refund reads it),
        unless the operator accepts it ``unverified``.
        """
        status = self._memory.calls[decision.step_id]
        step = StepInput(step_id=status.step_id, tool=status.tool, arguments=status.arguments)
        policy = self._policy(step.tool)
        if policy.lookup_activity is None or decision.decision is ReconcileDecision.ABANDON:
            unchecked = decision.decision is ReconcileDecision.HAPPENED
            return _DecisionCheck(verified=False if unchecked else None)
        if (
            decision.decision is ReconcileDecision.HAPPENED
            and not policy.lookup_verifies_resource_ids
        ):
            return _DecisionCheck(verified=False)
        claimed = decision.resource_id
        happened = decision.decision is ReconcileDecision.HAPPENED
        self._checking.add(decision.step_id)
        try:
            answer = await self._ask_look_up(
                step,
                policy,
                status,
                claimed_resource_id=claimed,
                accept_unverified=decision.unverified and happened,
                why=f"to check {decision.operator}'s decision {decision.decision.value}",
            )
        finally:
            self._checking.discard(decision.step_id)
        found = answer if answer is not None and answer.outcome is OutcomeClass.SUCCEEDED else None
        finding = _describe_finding(found) if found else status.evidence.get("lookup")
        if decision.decision is ReconcileDecision.DID_NOT_HAPPEN:
            return self._check_did_not_happen(decision, status, answer, finding)
        if decision.unverified:
            # Accepted whatever the look-up found; it recorded the resource if it could.
            return _DecisionCheck(verified=False, finding=finding)
        if found is not None and found.resource_id == claimed:
            self._verified[decision.step_id] = found
            return _DecisionCheck(verified=True, finding=finding)
        return _DecisionCheck(
            finding=finding,
            refusal=(
                f"refused: the look-up could not confirm {claimed} as step "
                f"{decision.step_id}'s effect ({finding or 'nothing found'}); check the id, "
                "or accept it with --unverified (recorded as unverified)"
            ),
        )

    def _check_did_not_happen(
        self,
        decision: ReconcileInput,
        status: StepStatus,
        answer: ToolAttemptResult | None,
        finding: str | None,
    ) -> "_DecisionCheck":
        """Refused when the look-up found the effect; accepted when its miss proves the
        effect does not exist (a consistent read, or an eventual one past its lag since
        the key's last attempt) or the operator accepts it ``unverified``."""
        if answer is not None and answer.outcome is OutcomeClass.SUCCEEDED:
            return _DecisionCheck(
                finding=finding,
                refusal=(
                    f"refused: step {decision.step_id}'s effect was found: {finding}; nothing "
                    f"was sent. If it is the step's, decide happened --resource-id "
                    f"{answer.resource_id}"
                ),
            )
        if decision.unverified:
            return _DecisionCheck(verified=False, finding=finding)
        if answer is not None and answer.miss_proves_absence:
            # Past an eventual look-up's lag too: the activity judged it, and its answer
            # is in history (a clock read here might not replay).
            return _DecisionCheck(verified=True, finding=finding)
        lag = answer.miss_proves_absence_after if answer is not None else None
        last = status.attempts[-1].finished_at if status.attempts else None
        wait = ""
        if lag is not None and last is not None:
            wait = f", or decide again after {(last + lag).isoformat(timespec='seconds')}"
        return _DecisionCheck(
            finding=finding,
            refusal=(
                f"refused: the look-up could not show that step {decision.step_id}'s effect "
                f"does not exist ({finding or 'it could not run'}); nothing was sent. Check "
                f"at the provider and decide did_not_happen again with --unverified{wait}"
            ),
        )

    def _accept_approval(
        self, decision: ApproveInput, *, via: Literal["update", "signal"]
    ) -> DecisionResult:
        self._approvals[decision.step_id] = decision
        self._memory.decisions.append(
            DecisionRecord(
                kind="approve",
                step_id=decision.step_id,
                decision="approve" if decision.approved else "deny",
                operator=decision.approver,
                reason=decision.reason,
                at=workflow.now(),
                via=via,
                arguments_digest=self._memory.calls[decision.step_id].arguments_digest,
                accepted=True,
            )
        )
        outcome = "approved: it will run" if decision.approved else "denied: it will not run"
        return DecisionResult(
            step_id=decision.step_id,
            step_state=self._memory.calls[decision.step_id].state,
            message=f"step {decision.step_id} {outcome}",
        )

    def _accept_reconciliation(
        self,
        decision: ReconcileInput,
        *,
        via: Literal["update", "signal"],
        check: "_DecisionCheck | None" = None,
    ) -> DecisionResult:
        self._reconciliations[decision.step_id] = decision
        self._memory.decisions.append(
            DecisionRecord(
                kind="reconcile",
                step_id=decision.step_id,
                decision=decision.decision.value,
                operator=decision.operator,
                reason=decision.reason,
                at=workflow.now(),
                via=via,
                arguments_digest=self._memory.calls[decision.step_id].arguments_digest,
                accepted=True,
                verified=check.verified if check else None,
                finding=check.finding if check else None,
            )
        )
        status = self._memory.calls[decision.step_id]
        retry = "gets one operator-authorised attempt"
        if self._old_key_unusable(status):
            retry += (
                f" under a new key (generation {status.key_generation + 1}: the old key can "
                "no longer be sent)"
            )
            if self._unusable_keys.get(status.step_id) is not KeyUnusable.STORED_FAILURE:
                retry += (
                    ", once no request under the old key can still take effect and a "
                    "look-up then finds nothing"
                )
        consequences = {
            ReconcileDecision.HAPPENED: f"succeeds with resource {decision.resource_id}",
            ReconcileDecision.DID_NOT_HAPPEN: retry,
            ReconcileDecision.ABANDON: "is abandoned and the task fails",
        }
        return DecisionResult(
            step_id=decision.step_id,
            step_state=self._memory.calls[decision.step_id].state,
            message=f"step {decision.step_id} {consequences[decision.decision]}",
        )

    def _record_rejected(
        self,
        kind: Literal["approve", "reconcile"],
        decision: ApproveInput | ReconcileInput,
        verdict: str,
        problem: str,
        finding: str | None = None,
    ) -> None:
        operator = decision.approver if isinstance(decision, ApproveInput) else decision.operator
        status = self._memory.calls.get(decision.step_id)
        self._memory.decisions.append(
            DecisionRecord(
                kind=kind,
                step_id=decision.step_id,
                decision=verdict,
                operator=operator,
                reason=decision.reason,
                at=workflow.now(),
                via="signal",
                arguments_digest=status.arguments_digest if status else "",
                accepted=False,
                rejection=problem,
                finding=finding,
            )
        )

    # ── bookkeeping ─────────────────────────────────────────────────────────────────

    def _finish_step(
        self, status: StepStatus, resource_id: str | None, result: dict[str, Any]
    ) -> None:
        self._changed = True
        status.state = StepState.SUCCEEDED
        status.resource_id = resource_id
        status.result = result

    def _stop_step(self, status: StepStatus, state: StepState, reason: str) -> None:
        self._changed = True
        status.state = state
        status.failure_reason = reason
        raise _StepStopped(reason)

    def _usage(self, status: StepStatus, saw_unknown: bool) -> StepUsage:
        waits = 0
        for attempt in reversed(status.attempts):
            if not attempt.database_unavailable:
                break
            waits += 1
        return StepUsage(
            task_attempts=self._memory.budgeted_attempts,
            step_attempts=sum(
                1
                for attempt in status.attempts
                if not attempt.operator_authorised and not attempt.database_unavailable
            ),
            elapsed=workflow.now() - self._memory.started_at - self._people_time(),
            step_saw_unknown=saw_unknown,
            database_waits=waits,
        )

    def _people_time(self) -> timedelta:
        """Time the deadline does not count: awaiting approval or parked."""
        return self._memory.waited_for_people

    def _first_attempt_of_key(self, status: StepStatus) -> AttemptRecord | None:
        """The first attempt sent under the step's current key generation, if any."""
        return next((a for a in status.attempts if a.key_generation == status.key_generation), None)

    def _set_state(self, state: TaskState) -> None:
        if self._open is not None and state is not TaskState.CLOSED:
            # Calls run side by side: the task is as its calls are (parked wins), which
            # the open task's loop publishes.
            self._changed = True
            return
        self._publish_state(state)

    def _publish_state(self, state: TaskState) -> None:
        """One upsert per change, from the main coroutine only: the parked-at time and an
        open task's new tools ride along, adding no command."""
        updates: list[SearchAttributeUpdate[Any]] = []
        if state is not self._state:
            updates.append(TASK_STATE.value_set(state.value))
            if state is TaskState.PARKED:
                updates.append(TASK_PARKED_AT.value_set(workflow.now()))
            elif self._state is TaskState.PARKED:
                updates.append(TASK_PARKED_AT.value_unset())
            self._state = state
        if self._open is not None:
            tools = sorted({call.tool for call in self._memory.calls.values()})
            if tools != self._published_tools:
                updates.append(TASK_TOOLS.value_set(tools))
                self._published_tools = tools
        if updates:
            workflow.upsert_search_attributes(updates)

    def _status(self) -> TaskStatus:
        return TaskStatus(
            workflow_id=workflow.info().workflow_id,
            tenant=self._task.tenant,
            principal=self._task.principal,
            state=self._state,
            steps=(
                [self._call_status(call_id) for call_id in self._memory.order]
                if self._open is not None
                else list(self._memory.calls.values())
            ),
            budget=BudgetStatus(
                budget=self._budget,
                attempts_used=self._memory.budgeted_attempts,
                attempts_left=max(
                    self._budget.max_attempts_per_task - self._memory.budgeted_attempts, 0
                ),
                operator_authorised_attempts=self._memory.operator_authorised_attempts,
                deadline_at=self._memory.started_at + self._budget.deadline + self._people_time(),
                waited_for_people=self._people_time(),
            ),
            decisions=self._memory.decisions,
            policies=self._memory.policies,
            failure_reason=self._failure_reason,
            open=self._open is not None,
            closing=self._closing,
            runs=self._memory.runs,
        )


@dataclass(frozen=True)
class _KeyWindow:
    """The send window of one key generation of a step: closed once ``timer`` fired."""

    generation: int
    timer: "asyncio.Task[None]"


class _DecisionCheck(BaseModel):
    """What checking a reconcile decision with the tool's look-up concluded."""

    refusal: str | None = None
    """Why the decision is refused; None when it may act."""
    verified: bool | None = None
    """Whether the look-up confirmed the decision (see ``DecisionRecord.verified``)."""
    finding: str | None = None
    """What the look-up found, in words (ids, amounts)."""


def _approval_details(status: StepStatus) -> str:
    return (
        f"Step {status.step_id} ({status.tool}) awaits approval of arguments "
        f"{status.arguments_digest}.\n\n"
        f"`onceflow approve {workflow.info().workflow_id} --step {status.step_id} "
        f"--approve|--deny --reason TEXT`"
    )


def _park_details(status: StepStatus) -> str:
    evidence = "\n".join(f"- {name}: {value}" for name, value in sorted(status.evidence.items()))
    trace_id = workflow.memo_value(TRACE_ID_MEMO, default=None, type_hint=str)
    trace = f"\n\nTrace: `{trace_id}`" if trace_id else ""
    return (
        f"Parked at step {status.step_id} ({status.tool}): {status.park_reason}\n\n"
        f"Evidence:\n{evidence or '- none'}\n\nDecide with:\n`{status.reconcile_command}`"
        f"{trace}"
    )


def _describe_finding(found: ToolAttemptResult) -> str:
    details = ", ".join(
        f"{name} {found.result[name]}"
        for name in ("status", "amount", "currency")
        if found.result.get(name) is not None
    )
    return f"{found.resource_id}" + (f" ({details})" if details else "")


def _count(name: str, **attributes: str) -> None:
    """Add one to a counter; Temporal's workflow meter records nothing during replay."""
    workflow.metric_meter().create_counter(name).add(1, attributes)


def _not_registered(failure: ActivityError) -> bool:
    # The SDK's own refusal, raised before any activity code runs.
    cause = failure.cause
    return (
        isinstance(cause, ApplicationError)
        and cause.type == "NotFoundError"
        and "is not registered on this worker" in cause.message
    )


def _not_started_in_time(failure: ActivityError) -> bool:
    # Temporal's own timeout: no worker picked the attempt up, so nothing ran.
    cause = failure.cause
    return isinstance(cause, TemporalTimeout) and cause.type is TimeoutType.SCHEDULE_TO_START


def _describe_activity_failure(failure: ActivityError) -> str:
    cause = failure.cause
    if isinstance(cause, ApplicationError):
        return f"the activity raised {cause.type or 'an error'}: {cause.message}; outcome unknown"
    if cause is not None:
        return f"the activity did not report ({type(cause).__name__}: {cause}); outcome unknown"
    return "the activity failed without a cause; outcome unknown"
