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

This module holds the workflow's entry points (run, the query, the Updates, the signals
and the validators); each hands its work to one of the parts the workflow owns, one job
each, composed rather than inherited:
- ``_task_run.TaskRun``: this run's own state, beside ``TaskMemory`` (what continue-as-new
  carries);
- ``_task_book.TaskBook``: the task's input, memory and run state, with the bookkeeping
  every part shares (budget, people time, the published state, the status, the outcome
  record);
- ``_key_windows.KeyWindows``: the send window of each step's key;
- ``_look_ups.LookUps``: asking the provider whether a step's effect happened;
- ``_tool_calls``: a step's call of its tool's activities, built and run once, as an
  attempt and a look-up both make it;
- ``_people_decisions.PeopleDecisions``: approvals and reconciliations checked and
  recorded, and the parked step's wait for its reconciliation;
- ``_step_runner.StepRunner``: a step's attempts, look-up, approval and parking;
- ``_plan_steps.PlanSteps``: a plan's steps in order and its end;
- ``_open_task_calls.OpenTaskCalls``: an open task's calls, ends and continue-as-new.

Which handler may issue commands: none. An Update or signal handler validates, records
a decision or a call in the run's state and waits for a condition; every command (an
activity, a timer, a marker, a search attribute) starts in ``run``'s coroutine or in a
step's. Commands from handlers would interleave with other Updates' acceptances in an
order a replay does not reproduce. So a call's Update starts the call's coroutine and
waits for its answer (``OpenTaskCalls.take``), and a reconcile decision's look-up runs in
the parked step's own coroutine: the handler leaves the decision in
``TaskRun.check_requests`` and takes the verdict from ``TaskRun.check_verdicts``
(``PeopleDecisions.await_reconciliation``), so two decisions accepted in one workflow task
replay as they ran. The exceptions belong to release 0.1.0, whose tasks replay only as
0.1.0 ran them: learning which release started a run asks ``patched`` on replay only, a
marker only where 0.1.0 recorded one (``TaskBook.take_release_of_start``), and a 0.1.0
task pins a call's tool, publishes its tools and checks a decision in the handler, as
0.1.0 did. Handlers share the run's state without a lock: the workflow runs one coroutine
at a time, a handler awaits only a condition, and the one wait that spans a check keeps
a second decision on the same step out (``TaskRun.checking``, refused by the validator).

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

from typing import ClassVar

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from onceflow.tools.worker import CATALOGUE, Catalogue
    from onceflow.workflows.task_models import (
        TRACE_ID_MEMO,
        AgentTaskInput,
        ApproveInput,
        CallAnswer,
        CallInput,
        DecisionResult,
        ReconcileInput,
        TaskStatus,
    )
from onceflow.workflows._key_windows import KeyWindows
from onceflow.workflows._look_ups import LookUps
from onceflow.workflows._open_task_calls import OpenTaskCalls
from onceflow.workflows._people_decisions import PeopleDecisions
from onceflow.workflows._plan_steps import PlanSteps
from onceflow.workflows._step_runner import StepRunner
from onceflow.workflows._task_book import (
    ENDED_STEP_STATES,
    NO_EFFECT_STEP_STATES,
    SETTLED_STEP_STATES,
    TaskBook,
    ToolNotOnThisWorker,
    memory_of_run,
)
from onceflow.workflows._task_run import TaskRun

__all__ = [
    "ENDED_STEP_STATES",
    "NO_EFFECT_STEP_STATES",
    "SETTLED_STEP_STATES",
    "TRACE_ID_MEMO",
    "AgentTaskWorkflow",
    "ToolNotOnThisWorker",
]


@workflow.defn
class AgentTaskWorkflow:
    """Runs an agent task's tool calls in order, retrying only within its budget."""

    catalogue: ClassVar[Catalogue] = CATALOGUE
    """The tools this worker knows, asked only live (a call's validator, whether this
    worker can run an attempt), never on replay. Default: the process's ``CATALOGUE``; a
    test's next release names its own, as another process would have it."""

    @workflow.init
    def __init__(self, task: AgentTaskInput) -> None:
        memory = memory_of_run(task)
        self._book = TaskBook(task, memory, TaskRun(waiting_since=memory.started_at))
        keys = KeyWindows(self._book)
        look_ups = LookUps(self._book)
        self._decisions = PeopleDecisions(self._book, keys, look_ups)
        steps = StepRunner(self._book, keys, look_ups, self._decisions, self.catalogue)
        self._plan = PlanSteps(self._book, steps)
        self._calls = OpenTaskCalls(self._book, steps, self.catalogue)

    @workflow.run
    async def run(self, task: AgentTaskInput) -> TaskStatus:
        if task.open is not None:
            return await self._calls.run(task)
        return await self._plan.run(task)

    @workflow.query
    def status(self) -> TaskStatus:
        """The task's state, every step's attempts, evidence and the budget spent."""
        return self._book.status()

    @workflow.update
    def approve(self, decision: ApproveInput) -> DecisionResult:
        """Approve or deny a step awaiting approval (validated before it is recorded)."""
        return self._decisions.approve_by_update(decision)

    @approve.validator
    def _validate_approve(self, decision: ApproveInput) -> None:
        problem = self._decisions.approval_problem(decision)
        if problem:
            raise ValueError(problem)

    @workflow.signal(name="approve")
    def approve_signal(self, decision: ApproveInput) -> None:
        """The same decision as ``approve``, for the UI; an invalid one is only recorded."""
        self._decisions.approve_by_signal(decision)

    @workflow.signal
    def starter_stopped_waiting(self) -> None:
        """The request that started this plan task answered before the task ended (202):
        the task writes its outcome into its idempotency record itself, as one that asked
        people does, instead of leaving it to the next repeat or the upkeep pass."""
        self._book.run.starter_stopped_waiting = True

    @workflow.update
    async def reconcile(self, decision: ReconcileInput) -> DecisionResult:
        """Decide a parked step: happened, did_not_happen or abandon.

        The tool's look-up checks the decision first: a refusal (the effect was found
        after all, or the named resource is not the step's) is the Update's failure, and
        nothing is recorded but the look-up's evidence.
        """
        return await self._decisions.reconcile_by_update(decision)

    @reconcile.validator
    def _validate_reconcile(self, decision: ReconcileInput) -> None:
        problem = self._decisions.reconciliation_problem(decision)
        if problem:
            raise ValueError(problem)

    @workflow.signal(name="reconcile")
    async def reconcile_signal(self, decision: ReconcileInput) -> None:
        """The same decision as ``reconcile``, for the UI; an invalid one, or one its
        check refuses, is only recorded."""
        await self._decisions.reconcile_by_signal(decision)

    @workflow.update
    async def call(self, request: CallInput) -> CallAnswer:
        """Run one tool call of an open task (the agent's model picked it).

        Answers when the call ends, or as soon as it parks or awaits approval (send the
        same call again with ``wait_until_ended`` to wait for the person's decision). The
        same call id with the same tool and arguments is the same call; a new call
        identical to an earlier one that has not failed is answered by that one
        (``repeat_of``) unless it is a ``deliberate_repeat``.
        """
        return await self._calls.take(request)

    @call.validator
    def _validate_call(self, request: CallInput) -> None:
        problem = self._calls.call_problem(request)
        if problem:
            raise ValueError(problem)

    @workflow.update
    def close(self) -> TaskStatus:
        """Take no more calls: the task ends once its unfinished calls end."""
        return self._calls.close()

    @close.validator
    def _validate_close(self) -> None:
        problem = self._calls.close_problem()
        if problem:
            raise ValueError(problem)
