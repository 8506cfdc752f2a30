"""``OpenTaskCalls``: an open task's life, its calls taken one by one, the repeat guard,
idle and lifetime ends, continue-as-new."""

import asyncio
from datetime import datetime

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    # Summaries are identifiers only: readable in the UI when payloads are encrypted.
    from onceflow.encryption import ClearText
    from onceflow.errors import describe_validation
    from onceflow.tools.worker import Catalogue, ToolPolicy, UnknownTool
    from onceflow.tools.worker import arguments_digest as digest_arguments
    from onceflow.workflows.patches import OPEN_TASK_FEWER_ACTIONS, POLICIES_CARRIED
    from onceflow.workflows.task_models import (
        AgentTaskInput,
        CallAnswer,
        CallInput,
        OpenTaskOptions,
        OutcomeWriter,
        StepInput,
        StepState,
        StepStatus,
        TaskState,
        TaskStatus,
    )
    from onceflow.workflows.visibility import (
        TASK_KIND,
        TASK_STATE,
        TASK_TENANT,
        TASK_TOOLS,
    )
from onceflow.workflows._retired_policy_pin import (
    call_without_policy,
    pin_policies_as_before_0_3_0,
)
from onceflow.workflows._step_runner import StepRunner
from onceflow.workflows._task_book import (
    ENDED_STEP_STATES,
    MIN_TIMER,
    NO_EFFECT_STEP_STATES,
    SETTLED_STEP_STATES,
    StepStopped,
    TaskBook,
    approval_details,
    count_event,
    park_details,
)


class OpenTaskCalls:
    """Takes an open task's calls, runs each as a step, ends it, continues it as new."""

    # One per cached task: slots, no attribute dict to hold.
    __slots__ = ("_book", "_task", "_memory", "_run", "_steps", "_catalogue")

    def __init__(self, book: TaskBook, steps: StepRunner, catalogue: Catalogue) -> None:
        self._book = book
        self._task = book.task
        self._memory = book.memory
        self._run = book.run
        self._steps = steps
        self._catalogue = catalogue
        """The tools this worker knows, asked only live (``call_problem``)."""

    async def run(self, task: AgentTaskInput) -> TaskStatus:
        """Take calls until the task closes (by the agent, idle, or its lifetime) or
        continues as new, then answer its status."""
        options = task.open
        assert options is not None
        self._book.take_release_of_start()
        # Since 0.4.0: no upsert where the start set the attributes, one timer per idle
        # period. Asked once, at the run's first workflow task (a marker, no action).
        fewer_actions = not self._run.started_on_0_1_0 and workflow.patched(OPEN_TASK_FEWER_ACTIONS)
        self._run.state = self._open_state()
        if fewer_actions and task.started_with_attributes and task.carried is None:
            # Tenant, kind and state came with the start (free); tools are published
            # with the first change of state (``publish_state``).
            self._run.published_tools = []
        else:
            self._publish_all(task)
        lifetime_ends = self._memory.started_at + options.max_lifetime
        end_timer: asyncio.Task[None] | None = None
        armed_for = lifetime_ends
        while True:
            if self._run.call_crash is not None:
                # Visible in the UI and retried by Temporal (on a worker with the tool, or
                # after a fix); never a call left running with its Update unanswered.
                raise self._run.call_crash
            self._run.changed = False
            self._book.publish_state(self._open_state())
            workflow.set_current_details(self._open_details())
            unfinished = self._unfinished_calls()
            if self._run.started_on_0_1_0:
                self._close_by_the_clock_as_0_1_0(lifetime_ends, bool(unfinished))
            if self._run.closing is not None and not unfinished:
                if end_timer is not None:
                    end_timer.cancel()  # the task ends: its end's timer goes
                break
            if self._run.closing is None and not unfinished and self._should_continue_as_new():
                await workflow.wait_condition(workflow.all_handlers_finished)
                if not self._unfinished_calls() and not self._run.changed:
                    workflow.continue_as_new(self._carried(task))
                continue
            # Idle and lifetime ends are decided by a timer firing (in history), never by
            # comparing clocks here: a replay whose workflow tasks merged reads other
            # times. A timer only while nothing runs: a call in flight keeps the task
            # from idling, and the validator refuses calls past the lifetime, so a busy
            # task adds no timer per call.
            if unfinished or self._run.closing is not None:
                await workflow.wait_condition(lambda: self._run.changed)
                continue
            idle_ends = self._memory.last_call_at + options.idle_timeout
            if fewer_actions:
                # One timer runs through calls, armed for the end known when it was armed;
                # a call moves the idle end later without a new timer: when it fires, the
                # task ends if nothing moved its end, else it is armed for the rest.
                ends = min(lifetime_ends, idle_ends)
                if end_timer is None:
                    end_timer, armed_for = self._end_timer(ends), ends
                timer = end_timer
                await workflow.wait_condition(
                    lambda fired=timer: self._run.changed or fired.done()  # type: ignore[misc]
                )
                if timer.done() and not self._run.changed and not self._unfinished_calls():
                    end_timer = None
                    if ends <= armed_for:
                        self._run.closing = self._end_reason(options, lifetime_ends, idle_ends)
                continue
            try:
                await workflow.wait_condition(
                    lambda: self._run.changed,
                    timeout=max(min(lifetime_ends, idle_ends) - workflow.now(), MIN_TIMER),
                    timeout_summary=ClearText("idle timeout or maximum lifetime"),
                )
            except TimeoutError:
                if self._run.started_on_0_1_0:
                    continue  # the clock decides, at the top of the loop
                if not self._run.changed and not self._unfinished_calls():
                    self._run.closing = self._end_reason(options, lifetime_ends, idle_ends)
        if task.outcome_writer is not OutcomeWriter.NONE:
            await self._book.end_durably()
        self._book.end_as(TaskState.CLOSED)
        workflow.set_current_details(self._open_details())
        if task.outcome_writer is not OutcomeWriter.NONE:
            await self._book.record_outcome()
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self._book.status()

    def _publish_all(self, task: AgentTaskInput) -> None:
        """The run's first upsert: whose task it is, its kind, state and tools."""
        self._run.published_tools = sorted({call.tool for call in self._memory.calls.values()})
        workflow.upsert_search_attributes(
            [
                TASK_TENANT.value_set(task.tenant),
                TASK_KIND.value_set("open"),
                TASK_STATE.value_set(self._run.state.value),
                *(
                    [TASK_TOOLS.value_set(self._run.published_tools)]
                    if self._run.published_tools
                    else []
                ),
            ]
        )

    @staticmethod
    def _end_timer(ends: datetime) -> "asyncio.Task[None]":
        """The timer of the task's idle or lifetime end (a deadline passed fires at once)."""
        return asyncio.create_task(
            workflow.sleep(
                max(ends - workflow.now(), MIN_TIMER),
                summary=ClearText("idle timeout or maximum lifetime"),
            )
        )

    @staticmethod
    def _end_reason(options: OpenTaskOptions, lifetime_ends: datetime, idle_ends: datetime) -> str:
        return (
            f"its maximum lifetime ({options.max_lifetime}) ended"
            if lifetime_ends <= idle_ends
            else f"idle for {options.idle_timeout}"
        )

    async def take(self, request: CallInput) -> CallAnswer:
        """The Update ``call``, validated by ``call_problem``: the call's answer once it
        ends, or once it parks or awaits approval (unless ``wait_until_ended``)."""
        self._book.take_release_of_start()
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

    def close(self) -> TaskStatus:
        """The Update ``close``, validated by ``close_problem``: no more calls."""
        self._book.decision_admitted()
        if self._run.closing is None:
            self._run.closing = "closed by the agent"
            self._run.changed = True
        return self._book.status()

    def close_problem(self) -> str | None:
        """Why the task cannot be closed; None when it can."""
        if self._task.open is None:
            return "this task is a plan: it ends with its last step"
        return None

    def _close_by_the_clock_as_0_1_0(self, lifetime_ends: datetime, unfinished: bool) -> None:
        """0.1.0 decided an open task's idle and lifetime ends by comparing the clock at
        each turn of its loop; its tasks still do (a timer firing decides for the rest)."""
        options = self._task.open
        assert options is not None
        now = workflow.now()
        if self._run.closing is None and now >= lifetime_ends:
            self._run.closing = f"its maximum lifetime ({options.max_lifetime}) ended"
        elif self._run.closing is None and not unfinished:
            if now >= self._memory.last_call_at + options.idle_timeout:
                self._run.closing = f"idle for {options.idle_timeout}"

    async def _take_call_as_0_1_0(self, request: CallInput) -> None:
        """Take a call as 0.1.0 did, for its tasks: the tool pinned and the task's tools
        published from the Update handler, before the call is accepted."""
        if self._known_call(request.call_id):
            return
        if not await self._pin_tool(request.tool, carried=request.policy):
            raise ApplicationError(
                call_without_policy(request.tool), type="CallRefused", non_retryable=True
            )
        problem = self._call_state_problem(request)
        if problem:
            raise ApplicationError(problem, type="CallRefused", non_retryable=True)
        if self._known_call(request.call_id):
            return  # another Update with this call id was accepted while pinning
        self._accept_call(request)
        tools = sorted({call.tool for call in self._memory.calls.values()})
        if tools != self._run.published_tools:
            workflow.upsert_search_attributes([TASK_TOOLS.value_set(tools)])
            self._run.published_tools = tools

    def call_problem(self, request: CallInput) -> str | None:
        """Why a call cannot run, checked by the validator before anything is written;
        None if it can. Validators never run on replay: this is the one place a call's
        arguments meet this worker's input model."""
        problem = self._call_state_problem(request, live=True)
        if problem is not None or self._known_call(request.call_id):
            return problem
        if request.policy is not None and request.policy.tool != request.tool:
            return f"the call carries tool {request.policy.tool!r}'s policy, not {request.tool!r}'s"
        if request.policy is None and request.tool not in self._memory.policies:
            return call_without_policy(request.tool)
        try:
            self._catalogue.get(request.tool).input_model.model_validate(request.arguments)
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
        if self._task.open is None:
            return "this task is a plan: its steps were given when it started"
        if self._known_call(request.call_id):
            original = self._book.call_status(request.call_id)
            if original.tool != request.tool or original.arguments_digest != digest_arguments(
                request.tool, request.arguments
            ):
                return (
                    f"call id {request.call_id!r} was used for another call "
                    f"({original.tool} with arguments {original.arguments_digest}) in this task"
                )
            return None  # the same call again: answered with its status
        if self._run.closing is not None:
            return f"the task takes no more calls: {self._run.closing}"
        if live and workflow.now() >= self._memory.started_at + self._task.open.max_lifetime:
            return f"the task's maximum lifetime ({self._task.open.max_lifetime}) has ended"
        allowed = self._task.open.allowed_tools
        if allowed is not None and request.tool not in allowed:
            return f"tool {request.tool!r} is not allowed in this task"
        if request.deliberate_repeat and not self._allows_deliberate_repeats(request):
            return (
                f"tool {request.tool!r} does not allow deliberate repeats: an identical "
                "earlier call answers this one"
            )
        budget = self._book.budget
        if self._memory.budgeted_attempts >= budget.max_attempts_per_task:
            return (
                f"the task's retry budget is spent ({self._memory.budgeted_attempts} of "
                f"{budget.max_attempts_per_task} attempts used)"
            )
        used = workflow.now() - self._memory.started_at - self._book.people_time()
        if live and used >= budget.deadline:
            return f"the task's deadline ({budget.deadline} of machine time) has passed"
        return None

    def _allows_deliberate_repeats(self, request: CallInput) -> bool:
        """From the pinned policy, or the call's. A call without either is refused by the
        validator for that; one a task of an earlier release accepted so (and pinned in
        its coroutine, patch ``POLICIES_CARRIED``) is checked there once the tool is
        pinned."""
        policy = self._memory.policies.get(request.tool) or request.policy
        return True if policy is None else policy.deliberate_repeats

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
            count_event("onceflow_repeats_answered", tool=request.tool)
            self._memory.repeat_of[request.call_id] = earlier.step_id
            return
        self._memory.calls[request.call_id] = status
        self._run.calls_this_run += 1
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
            status = self._memory.calls[step.step_id]
            if step.tool not in self._memory.policies:
                # Only a call a task of an earlier release accepted without its policy:
                # the validator refuses those now.
                self._run.clock_before_pin[step.step_id] = workflow.now()
                if not await self._pin_tool(step.tool, carried=None):
                    self._run.clock_before_pin.pop(step.step_id, None)
                    self._book.stop_step(status, StepState.FAILED, call_without_policy(step.tool))
            if status.deliberate_repeat and not self._book.policy(step.tool).deliberate_repeats:
                self._book.stop_step(
                    status,
                    StepState.FAILED,
                    f"tool {step.tool!r} does not allow deliberate repeats: an identical "
                    "earlier call answers this one",
                )
            await self._steps.run_step(step)
        except StepStopped:
            pass  # the call's own state says how it ended; the task goes on
        except Exception as crash:
            self._run.call_crash = crash
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
                self._run.changed = True

    async def _pin_tool(self, tool: str, *, carried: ToolPolicy | None) -> bool:
        """Pin a tool's policy the first time a call of it runs: the one the call carries.
        False when it carries none and nothing else may pin it.

        Before 0.3.0 a local activity pinned it (the retired branch of
        ``POLICIES_CARRIED``): a task that did replays that; a 0.1.0 open task, whose
        handler pinned every new tool so, keeps doing it live once its replay answered
        ``patched`` with False (the answer holds for the run).
        """
        if tool in self._memory.policies:
            return True
        if workflow.patched(POLICIES_CARRIED):
            if carried is None:
                return False
            self._memory.policies[tool] = carried
            return True
        if tool in self._run.pinning:
            await workflow.wait_condition(lambda: tool in self._memory.policies)
            return True
        self._run.pinning.add(tool)
        try:
            for name, policy in (await pin_policies_as_before_0_3_0([tool])).items():
                self._memory.policies.setdefault(name, policy)  # an admitted call's came first
        finally:
            self._run.pinning.discard(tool)
        return True

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
        assert self._task.open is not None
        per_run = self._task.open.calls_per_run
        if per_run is not None and self._run.calls_this_run >= per_run:
            return True
        return workflow.info().is_continue_as_new_suggested()

    def _carried(self, task: AgentTaskInput) -> AgentTaskInput:
        return task.model_copy(update={"carried": self._memory.for_next_run()})

    def _call_answer(self, call_id: str) -> CallAnswer:
        repeat_of = self._memory.repeat_of.get(call_id)
        return CallAnswer(
            task_id=workflow.info().workflow_id,
            task_state=self._open_state()
            if self._run.state is not TaskState.CLOSED
            else self._run.state,
            call=self._book.call_status(call_id),
            repeat_of=repeat_of,
        )

    def _calls_summary(self) -> str:
        lines = [
            f"- {call.step_id}: {call.tool} {call.state.value}"
            + (f" (repeat of {self._memory.repeat_of[call.step_id]})" if call.repeat_of else "")
            for call in (self._book.call_status(call_id) for call_id in self._call_order())
        ]
        return f"Open task: {len(lines)} calls" + ("\n" + "\n".join(lines[-20:]) if lines else "")

    def _call_order(self) -> list[str]:
        return self._memory.order

    def _open_details(self) -> str:
        waiting = [
            park_details(call) if call.state is StepState.PARKED else approval_details(call)
            for call in self._memory.calls.values()
            if call.state in (StepState.PARKED, StepState.AWAITING_APPROVAL)
        ] + [
            f"call {call.step_id} ({call.tool}): {call.waiting_for_provider}"
            for call in self._memory.calls.values()
            if call.waiting_for_provider
        ]
        return "\n\n".join([self._calls_summary(), *waiting])
