"""The books of a task, kept by ``TaskBook``: the task's input, memory and run state,
with the bookkeeping every part of ``AgentTaskWorkflow`` shares and its outcome record;
the constants, errors and messages the parts share."""

from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
from temporalio.exceptions import TimeoutError as TemporalTimeout

with workflow.unsafe.imports_passed_through():
    # Summaries are identifiers only: readable in the UI when payloads are encrypted.
    from onceflow.encryption import ClearText
    from onceflow.errors import OnceflowError
    from onceflow.retry_policy import (
        OutcomeClass,
        RetryBudget,
        StepUsage,
    )
    from onceflow.tools import ToolAttemptResult
    from onceflow.tools.worker import ToolPolicy
    from onceflow.tools.worker import arguments_digest as digest_arguments
    from onceflow.workflows.patches import (
        DECISION_DURABLE_BEFORE_ACTING,
        NO_WAIT_AFTER_LAST_OUTCOME_WRITE,
        OUTCOME_AFTER_DURABLE_DECISION,
        START_PATCHES_FOLDED,
    )
    from onceflow.workflows.task_models import (
        RECORD_TASK_OUTCOME,
        TRACE_ID_MEMO,
        AgentTaskInput,
        BudgetStatus,
        OutcomeWriter,
        StepState,
        StepStatus,
        TaskMemory,
        TaskOutcomeInput,
        TaskState,
        TaskStatus,
    )
    from onceflow.workflows.visibility import (
        TASK_PARKED_AT,
        TASK_STATE,
        TASK_TOOLS,
    )
from onceflow.workflows._task_run import TaskRun

ONE_ATTEMPT = RetryPolicy(maximum_attempts=1)
OUTCOME_WRITES = 5
"""Writes of a task's outcome into its record before the task leaves it to the boundary."""


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
RETRYABLE = frozenset({OutcomeClass.UNKNOWN, OutcomeClass.TRANSIENT})
"""Outcomes a step may repeat after (within its budget and its key's window)."""
NO_EFFECT_STEP_STATES = frozenset({StepState.FAILED, StepState.DENIED})
"""Ended with no effect: an identical later call is a new call, not a repeat."""


class ToolNotOnThisWorker(OnceflowError, RuntimeError):
    """The worker running the workflow task does not know a step's tool: retry elsewhere."""

    code = "tool-not-on-this-worker"
    title = "Tool not on this worker"


class StepStopped(Exception):
    """The step ended without success; the task stops with the step's reason."""


def memory_of_run(task: AgentTaskInput) -> TaskMemory:
    """What the task knows as this run starts: what its earlier runs carried, or a new
    memory of the plan's steps (an open task's first run: none yet)."""
    if task.carried is not None:
        # A continued open task: everything its earlier runs knew, whole. Taken as it
        # came, not copied: the SDK keeps the run's input for the run's life and nothing
        # reads ``task.carried`` again, so a copy held every carried call twice (about
        # 800 KiB for 500 calls) as long as the task stayed cached.
        memory = task.carried
        memory.runs += 1
        return memory
    now = workflow.now()
    return TaskMemory(
        started_at=now,
        last_call_at=now,
        calls={
            step.step_id: StepStatus(
                step_id=step.step_id,
                tool=step.tool,
                arguments=step.arguments,
                arguments_digest=digest_arguments(step.tool, step.arguments),
                deliberate_repeat=step.deliberate_repeat,
            )
            for step in task.steps
        },
    )


class TaskBook:
    """The task's books: its input, its memory (``TaskMemory``, carried across runs) and
    this run's state (``TaskRun``), with the bookkeeping every part of the workflow shares
    (steps ended, budget used, people time, the published state, the status, the outcome
    record)."""

    def __init__(self, task: AgentTaskInput, memory: TaskMemory, run: TaskRun) -> None:
        self.task = task
        self.budget = task.budget or RetryBudget()
        """The task's retry budget (the default one when it came without)."""
        self.memory = memory
        self.run = run

    def take_release_of_start(self) -> None:
        """Learn whether release 0.1.0 started this run: its first workflow task recorded
        ``START_PATCHES_FOLDED`` here (a plan's after its search attributes, an open
        task's first thing). Asked only on replay, where ``patched`` answers whether
        history holds the marker and adds a command only to match it: a run live from
        its start records nothing. A 0.1.0 task's first workflow task is always a replay
        on a later release, since 0.1.0's worker ran it. Once per run, by whichever
        asks first: an open task's first call can come with its start (Update-with-Start),
        and its handler runs before ``run``."""
        if self.run.release_known:
            return
        self.run.release_known = True
        self.run.started_on_0_1_0 = workflow.unsafe.is_replaying() and workflow.patched(
            START_PATCHES_FOLDED
        )

    def finish_step(
        self, status: StepStatus, resource_id: str | None, result: dict[str, Any]
    ) -> None:
        """The step succeeded, with the resource it made and its result."""
        self.run.changed = True
        status.state = StepState.SUCCEEDED
        status.resource_id = resource_id
        status.result = result

    def stop_step(self, status: StepStatus, state: StepState, reason: str) -> None:
        """End the step without success (failed, denied, abandoned): its coroutine stops
        with ``StepStopped``."""
        self.run.changed = True
        status.state = state
        status.failure_reason = reason
        raise StepStopped(reason)

    def usage(self, status: StepStatus, saw_unknown: bool) -> StepUsage:
        """What the step and the task have used of the budget, for the retry decision."""
        waits = 0
        for attempt in reversed(status.attempts):
            if not attempt.database_unavailable:
                break
            waits += 1
        return StepUsage(
            task_attempts=self.memory.budgeted_attempts,
            step_attempts=sum(
                1
                for attempt in status.attempts
                if not attempt.operator_authorised and not attempt.free
            ),
            elapsed=workflow.now() - self.memory.started_at - self.people_time(),
            step_saw_unknown=saw_unknown,
            database_waits=waits,
        )

    def people_time(self) -> timedelta:
        """Time the deadline does not count: awaiting approval or parked."""
        return self.memory.waited_for_people

    def policy(self, tool: str) -> ToolPolicy:
        """The tool's pinned policy: pinned before any of its steps runs."""
        return self.memory.policies[tool]

    def set_state(self, state: TaskState) -> None:
        """The task's state changed: a plan publishes it; an open task's loop publishes
        what its calls add up to."""
        if self.task.open is not None:
            # Calls run side by side: the task is as its calls are (parked wins), which
            # the open task's loop publishes.
            self.run.changed = True
            return
        self.publish_state(state)

    def end_as(self, state: TaskState) -> None:
        """The task ends in ``state``: published, unless its close status will say it
        (``AgentTaskInput.ends_by_close_status``)."""
        if self.task.ends_by_close_status and state is not TaskState.FAILED:
            self.run.state = state
            return
        self.publish_state(state)

    def publish_state(self, state: TaskState) -> None:
        """One upsert per change, from the main coroutine only: the parked-at time and an
        open task's new tools ride along, adding no command."""
        updates: list[SearchAttributeUpdate[Any]] = []
        if state is not self.run.state:
            updates.append(TASK_STATE.value_set(state.value))
            if state is TaskState.PARKED:
                updates.append(TASK_PARKED_AT.value_set(workflow.now()))
            elif self.run.state is TaskState.PARKED:
                updates.append(TASK_PARKED_AT.value_unset())
            self.run.state = state
        if self.task.open is not None:
            tools = sorted({call.tool for call in self.memory.calls.values()})
            if tools != self.run.published_tools:
                updates.append(TASK_TOOLS.value_set(tools))
                self.run.published_tools = tools
        if updates:
            workflow.upsert_search_attributes(updates)

    def begin_waiting_for_people(self, now: datetime | None = None) -> None:
        """A step waits for a person (an approval, a reconciliation): off the clock."""
        self.begin_off_the_clock(now)
        self.run.asked_people = True

    def end_waiting_for_people(self) -> None:
        self.end_off_the_clock()

    def begin_off_the_clock(self, now: datetime | None = None) -> None:
        """A wait the deadline does not count begins: for a person, or for a provider.
        Calls of an open task may wait side by side: the time at least one of them
        waits counts once."""
        if self.run.waiting_for_people == 0:
            self.run.waiting_since = now or workflow.now()
        self.run.waiting_for_people += 1

    def end_off_the_clock(self) -> None:
        self.run.waiting_for_people -= 1
        if self.run.waiting_for_people == 0:
            self.memory.waited_for_people += workflow.now() - self.run.waiting_since

    def show_details(self, details: str) -> None:
        """The Temporal UI's current details: a plan's waiting step; an open task's
        calls and every waiting one (its loop composes them)."""
        if self.task.open is None:
            workflow.set_current_details(details)

    def call_status(self, call_id: str) -> StepStatus:
        """A call's status; a repeat's is that of the call answering it, under its own id."""
        repeat_of = self.memory.repeat_of.get(call_id)
        if repeat_of is None:
            return self.memory.calls[call_id]
        return self.memory.calls[repeat_of].model_copy(
            update={"step_id": call_id, "attempts": [], "repeat_of": repeat_of}
        )

    def status(self) -> TaskStatus:
        """The task's status, as the query answers it and the outcome record keeps it."""
        return TaskStatus(
            workflow_id=workflow.info().workflow_id,
            tenant=self.task.tenant,
            principal=self.task.principal,
            state=self.run.state,
            steps=(
                [self.call_status(call_id) for call_id in self.memory.order]
                if self.task.open is not None
                else list(self.memory.calls.values())
            ),
            budget=BudgetStatus(
                budget=self.budget,
                attempts_used=self.memory.budgeted_attempts,
                attempts_left=max(
                    self.budget.max_attempts_per_task - self.memory.budgeted_attempts, 0
                ),
                operator_authorised_attempts=self.memory.operator_authorised_attempts,
                deadline_at=self.memory.started_at + self.budget.deadline + self.people_time(),
                waited_for_people=self.people_time(),
            ),
            decisions=self.memory.decisions,
            policies=self.memory.policies,
            failure_reason=self.run.failure_reason,
            open=self.task.open is not None,
            closing=self.run.closing,
            runs=self.memory.runs,
        )

    def writes_its_outcome(self) -> bool:
        """Whether this workflow writes the task's outcome into its idempotency record
        (``AgentTaskInput.outcome_writer``; the rules: ``onceflow.idempotency``): when it
        is the writer, or when the starter is and no longer waits (its request was
        answered with a 202 once a step waited for a person, or when its bounded wait
        ended first: ``starter_stopped_waiting``)."""
        writer = self.task.outcome_writer
        if writer is OutcomeWriter.STARTER:
            return self.run.asked_people or self.run.starter_stopped_waiting
        return writer is OutcomeWriter.WORKFLOW

    def decision_admitted(self) -> None:
        """A decision Update is admitted in this workflow task (``end_durably``,
        ``act_durably``)."""
        self.run.decision_admitted_at = workflow.info().get_current_history_length()

    async def end_durably(self) -> None:
        """Before a task that records its outcome shows its end: make sure the decision
        that ended it is in history.

        When a decision Update (approve, reconcile, close) ends the task in the workflow
        task that admitted it, that workflow task is not in history until it completes: a
        worker lost before then, and a Temporal restart that forgets the Update, would
        leave a record (and a status) of an end the task never reached, while it still
        awaits the decision. A timer completes that workflow task first; the end is shown
        and recorded in the next one.
        """
        if self.run.decision_admitted_at == workflow.info().get_current_history_length():
            if workflow.patched(OUTCOME_AFTER_DURABLE_DECISION):
                await workflow.sleep(MIN_TIMER, summary=ClearText("make the decision durable"))

    async def act_durably(self) -> None:
        """Before a step acts on a decision Update accepted in this workflow task: make
        sure the decision and the Update's answer are in history first.

        What the step does next may fail the workflow task (an attempt of a tool this
        worker lacks: ``StepRunner._require_tool``), which would drop the Update's answer
        with it and leave the operator's command waiting. A timer completes this workflow
        task first; the step acts in the next one.
        """
        if self.run.decision_admitted_at == workflow.info().get_current_history_length():
            if workflow.patched(DECISION_DURABLE_BEFORE_ACTING):
                await workflow.sleep(MIN_TIMER, summary=ClearText("make the decision durable"))

    async def record_outcome(self) -> None:
        """Write the task's outcome into its idempotency record, a few tries at most."""
        # The record is the boundary's answer to repeats. Writing it is an idempotent
        # local update, so the workflow (still the only retry owner) tries a few times;
        # if all fail, the boundary falls back to asking the workflow itself.
        outcome = TaskOutcomeInput(workflow_id=workflow.info().workflow_id, status=self.status())
        summary = ClearText("record the task's result for repeated requests")
        for attempt in range(1, OUTCOME_WRITES + 1):
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
                    describe_activity_failure(failure)
                    if isinstance(failure, ActivityError)
                    else f"the activity raised {failure.type or 'an error'}: {failure.message}",
                )
                if attempt == OUTCOME_WRITES and workflow.patched(NO_WAIT_AFTER_LAST_OUTCOME_WRITE):
                    return  # no write follows the backoff: it would only delay the end
                await workflow.sleep(timedelta(seconds=2**attempt))


def approval_details(status: StepStatus) -> str:
    return (
        f"Step {status.step_id} ({status.tool}) awaits approval of arguments "
        f"{status.arguments_digest}.\n\n"
        f"`onceflow approve {workflow.info().workflow_id} --step {status.step_id} "
        f"--approve|--deny --reason TEXT`"
    )


def park_details(status: StepStatus) -> str:
    evidence = "\n".join(f"- {name}: {value}" for name, value in sorted(status.evidence.items()))
    trace_id = workflow.memo_value(TRACE_ID_MEMO, default=None, type_hint=str)
    trace = f"\n\nTrace: `{trace_id}`" if trace_id else ""
    return (
        f"Parked at step {status.step_id} ({status.tool}): {status.park_reason}\n\n"
        f"Evidence:\n{evidence or '- none'}\n\nDecide with:\n`{status.reconcile_command}`"
        f"{trace}"
    )


def describe_finding(found: ToolAttemptResult) -> str:
    details = ", ".join(
        f"{name} {found.result[name]}"
        for name in ("status", "amount", "currency")
        if found.result.get(name) is not None
    )
    return f"{found.resource_id}" + (f" ({details})" if details else "")


def count_event(name: str, **attributes: str) -> None:
    """Add one to a counter; Temporal's workflow meter records nothing during replay."""
    workflow.metric_meter().create_counter(name).add(1, attributes)


def not_registered(failure: ActivityError) -> bool:
    # The SDK's own refusal, raised before any activity code runs.
    cause = failure.cause
    return (
        isinstance(cause, ApplicationError)
        and cause.type == "NotFoundError"
        and "is not registered on this worker" in cause.message
    )


def not_started_in_time(failure: ActivityError) -> bool:
    # Temporal's own timeout: no worker picked the attempt up, so nothing ran.
    cause = failure.cause
    return isinstance(cause, TemporalTimeout) and cause.type is TimeoutType.SCHEDULE_TO_START


def describe_activity_failure(failure: ActivityError) -> str:
    cause = failure.cause
    if isinstance(cause, ApplicationError):
        return f"the activity raised {cause.type or 'an error'}: {cause.message}; outcome unknown"
    if cause is not None:
        return f"the activity did not report ({type(cause).__name__}: {cause}); outcome unknown"
    return "the activity failed without a cause; outcome unknown"
