"""``AgentTaskWorkflow``: one agent task, its steps run in order under one retry budget,
or an open task whose calls arrive one by one (Update ``call``) under one budget.

The workflow is the only retry owner: every activity runs with ``maximum_attempts=1``
and after each attempt the workflow asks ``retry_policy`` what to do. An unknown outcome
whose repeat is not provably safe parks the step until an operator decides.

It decides only from its pinned policy: every tool's ``ToolPolicy`` comes in the start
input (a plan) or with the tool's first call (an open task), resolved by the process
that admitted it, so a process with other settings changes new tasks, never this one. A
plan started without them fails at its first workflow task, a call without its policy is
refused by the ``call`` validator; tasks of earlier releases that pinned them with a local
activity replay that path (``_retired_policy_pin``, patch ``POLICIES_CARRIED``). A
repeat under a key the provider forgets is checked against the key's send window after
every backoff, bounded by it while it waits for a worker, and checked again by the
attempt itself.

This module holds the workflow's entry points (run, the query, the Updates and signals);
its parts, one job each, are the classes it is made of: ``_task_core.TaskCore`` (the
task's state and memory, bookkeeping, the outcome record), ``_step_runs.StepRuns`` (a
step's attempts, look-ups, approval and parking), ``_people_decisions.PeopleDecisions``
(approvals and reconciliations checked and recorded) and ``_open_task_runs.OpenTaskRuns``
(an open task's calls, ends and continue-as-new).

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

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from onceflow.workflows.patches import POLICIES_CARRIED
    from onceflow.workflows.task_models import (
        TRACE_ID_MEMO,
        AgentTaskInput,
        ApproveInput,
        CallAnswer,
        CallInput,
        DecisionResult,
        ReconcileInput,
        TaskState,
        TaskStatus,
    )
    from onceflow.workflows.visibility import (
        TASK_STATE,
        TASK_TENANT,
        TASK_TOOLS,
    )
from onceflow.workflows._open_task_runs import OpenTaskRuns
from onceflow.workflows._people_decisions import PeopleDecisions
from onceflow.workflows._retired_policy_pin import (
    pin_policies_as_before_0_3_0,
    started_without_policies,
)
from onceflow.workflows._task_core import (
    ENDED_STEP_STATES,
    NO_EFFECT_STEP_STATES,
    SETTLED_STEP_STATES,
    StepStopped,
    ToolNotOnThisWorker,
)

__all__ = [
    "ENDED_STEP_STATES",
    "NO_EFFECT_STEP_STATES",
    "SETTLED_STEP_STATES",
    "TRACE_ID_MEMO",
    "AgentTaskWorkflow",
    "ToolNotOnThisWorker",
]


@workflow.defn
class AgentTaskWorkflow(OpenTaskRuns, PeopleDecisions):
    """Runs an agent task's tool calls in order, retrying only within its budget."""

    @workflow.init
    def __init__(self, task: AgentTaskInput) -> None:
        super().__init__(task)

    @workflow.run
    async def run(self, task: AgentTaskInput) -> TaskStatus:
        if task.open is None and task.policies is None and workflow.patched(POLICIES_CARRIED):
            # Started by hand without what every admitted plan carries: refused before it
            # does anything (a task of an earlier release replays the pin below).
            raise started_without_policies()
        if task.open is not None:
            return await self._run_open(task)
        if not task.started_with_attributes:
            workflow.upsert_search_attributes(
                [
                    TASK_TENANT.value_set(task.tenant),
                    TASK_TOOLS.value_set(task.plan_tools()),
                    TASK_STATE.value_set(self._run.state.value),
                ]
            )
        self._take_release_of_start()
        if task.policies is not None:
            self._memory.policies = dict(task.policies)
        else:
            # Retired (POLICIES_CARRIED): only a plan started without policies before
            # 0.3.0 gets here. Its first step counts from the time before the local
            # activity (see StepRuns._clock_before_pin).
            if task.steps:
                self._run.clock_before_pin[task.steps[0].step_id] = workflow.now()
            self._memory.policies = await pin_policies_as_before_0_3_0(
                sorted({s.tool for s in task.steps})
            )
        failure = None
        try:
            for step in task.steps:
                await self._run_step(step)
        except StepStopped as stopped:
            failure = str(stopped)
        records = self._writes_its_outcome()
        if records:
            await self._end_durably()
        self._run.failure_reason = failure
        self._set_state(TaskState.SUCCEEDED if failure is None else TaskState.FAILED)
        if records:
            await self._record_outcome()
        # A decision arriving as the task ends must finish before the workflow completes.
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self._status()

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

    @workflow.signal
    def starter_stopped_waiting(self) -> None:
        """The request that started this plan task answered before the task ended (202):
        the task writes its outcome into its idempotency record itself, as one that asked
        people does, instead of leaving it to the next repeat or the upkeep pass."""
        self._run.starter_stopped_waiting = True

    @workflow.update
    async def reconcile(self, decision: ReconcileInput) -> DecisionResult:
        """Decide a parked step: happened, did_not_happen or abandon.

        The tool's look-up checks the decision first: a refusal (the effect was found
        after all, or the named resource is not the step's) is the Update's failure, and
        nothing is recorded but the look-up's evidence.
        """
        self._decision_admitted()
        check = await self._decision_check(decision)
        if check.refusal is not None:
            raise ApplicationError(check.refusal, type="DecisionRefused", non_retryable=True)
        self._decision_admitted()  # accepted in this workflow task (see _act_durably)
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
        check = await self._decision_check(decision)
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
        self._take_release_of_start()
        self._memory.last_call_at = workflow.now()
        self._run.changed = True
        if self._run.started_on_0_1_0:
            await self._take_call_as_0_1_0(request)
        elif not self._known_call(request.call_id):
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
        if self._run.closing is None:
            self._run.closing = "closed by the agent"
            self._run.changed = True
        return self._status()

    @close.validator
    def _validate_close(self) -> None:
        if self._open is None:
            raise ValueError("this task is a plan: it ends with its last step")
