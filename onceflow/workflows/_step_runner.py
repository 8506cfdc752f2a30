"""``StepRunner``: how a step runs, its attempts under the budget and its key's window,
its look-up before parking, its wait for approval, parking."""

import contextlib
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    # Summaries are identifiers only: readable in the UI when payloads are encrypted.
    from onceflow.encryption import ClearText
    from onceflow.retry_policy import (
        FailStep,
        OutcomeClass,
        ParkStep,
        RetryStep,
        decide_after_attempt,
    )
    from onceflow.tools import ToolAttemptResult
    from onceflow.tools.providers import ProviderHold, Send
    from onceflow.tools.worker import Catalogue, KeyUnusable, ToolCallInput, ToolPolicy
    from onceflow.workflows.patches import (
        DATABASE_WAITS,
        KEY_GENERATIONS,
        OLD_KEY_SETTLES,
        UNREGISTERED_ACTIVITY_IS_TRANSIENT,
    )
    from onceflow.workflows.task_models import (
        AttemptRecord,
        ReconcileDecision,
        ReconcileInput,
        StepInput,
        StepState,
        StepStatus,
        TaskState,
    )
from onceflow.workflows._key_windows import KeyWindows
from onceflow.workflows._look_ups import LookUps
from onceflow.workflows._people_decisions import PeopleDecisions
from onceflow.workflows._task_book import (
    MIN_TIMER,
    RETRYABLE,
    TaskBook,
    ToolNotOnThisWorker,
    approval_details,
    count_event,
    describe_activity_failure,
    not_registered,
    not_started_in_time,
    park_details,
)
from onceflow.workflows._tool_calls import execute_once, tool_call_input

MIN_PROVIDER_RECHECK = timedelta(seconds=1)
"""Shortest wait before a held step asks its provider's budget again."""
PROVIDER_RECHECK_SPREAD = 0.5
"""Each held step asks again up to this share later than the budget said, so the steps
held together do not all ask at one instant."""


class StepRunner:
    """Runs steps: attempts, retries within the budget and the key's window, look-ups,
    waits for approval, parks."""

    # One per cached task: slots, no attribute dict to hold.
    __slots__ = (
        "_book",
        "_task",
        "_memory",
        "_run",
        "_keys",
        "_look_ups",
        "_decisions",
        "_catalogue",
    )

    def __init__(
        self,
        book: TaskBook,
        keys: KeyWindows,
        look_ups: LookUps,
        decisions: PeopleDecisions,
        catalogue: Catalogue,
    ) -> None:
        self._book = book
        self._task = book.task
        self._memory = book.memory
        self._run = book.run
        self._keys = keys
        self._look_ups = look_ups
        self._decisions = decisions
        self._catalogue = catalogue
        """The tools this worker knows, asked only live (``_require_tool``)."""

    async def run_step(self, step: StepInput) -> None:
        """Run one step to its end (or until it parks for good), then stop its key
        window's timer: it matters only while the step may still send."""
        try:
            await self._run_step_attempts(step)
        except GeneratorExit:
            raise  # closed outside the workflow's event loop (evicted): nothing to stop
        except BaseException:
            self._keys.stop(step.step_id)
            raise
        self._keys.stop(step.step_id)

    async def _run_step_attempts(self, step: StepInput) -> None:
        """Attempt the step until it succeeds, stops, or an operator ends it.

        Decides from history alone: the pinned policy and the arguments as recorded (the
        approval threshold reads them; the attempt validates them with the tool's input
        model and records a rejection as its outcome), never from this worker's input
        model, so a worker whose model changed still replays and finishes old tasks.
        """
        status = self._memory.calls[step.step_id]
        policy = self._book.policy(step.tool)
        # Set only by the retired pin (POLICIES_CARRIED), for a task of an earlier release.
        started_at = self._run.clock_before_pin.pop(step.step_id, None)
        if policy.needs_approval(step.arguments):
            await self._await_approval(status, now=started_at)
            started_at = None
        operator_authorised = False
        saw_unknown = False
        reserved = False
        while True:
            result = await self._attempt(
                step, policy, status, operator_authorised, started_at=started_at, reserved=reserved
            )
            started_at, reserved = None, False
            if result.outcome is OutcomeClass.SUCCEEDED:
                self._book.finish_step(status, result.resource_id, result.result)
                return
            saw_unknown = saw_unknown or result.outcome is OutcomeClass.UNKNOWN
            operator_authorised = False
            if result.provider_hold is not None:
                # The provider did not let the step send within its wait limit.
                reason = (
                    f"step {step.step_id}: its provider did not let it send within "
                    f"{policy.provider_wait_limit} ({result.provider_hold.reason})"
                )
                if not saw_unknown:
                    self._book.stop_step(status, StepState.FAILED, reason)
                if await self._look_up_or_park(step, policy, status, reason):
                    return
                operator_authorised, saw_unknown = True, False
                continue
            if result.throttled_for is not None:
                # "Not now" from the provider: nothing done, no cap spent. The next
                # attempt waits for the provider's budget to let it send.
                continue
            closed = self._keys.why_closed(policy, status)
            if closed is not None and result.key_unusable is None and result.outcome in RETRYABLE:
                # The window's timer fired before the attempt's end reached the workflow.
                last = f" (last attempt: {result.reason})" if result.reason else ""
                result = result.model_copy(
                    update={"key_unusable": KeyUnusable.SEND_BY_PASSED, "reason": closed + last}
                )
            if result.key_unusable is not None:
                # No attempt may send under this key any more, whatever the budget says.
                count_event("onceflow_key_unusable", tool=step.tool, why=result.key_unusable.value)
                reason = result.reason or f"the step's key is unusable ({result.key_unusable})"
                if await self._look_up_or_park(
                    step, policy, status, reason, key_unusable=result.key_unusable
                ):
                    return
                operator_authorised, saw_unknown = True, False
                continue
            decision = decide_after_attempt(
                self._book.budget,
                result.outcome,
                self._book.usage(status, saw_unknown),
                safe_repeat_window=self._keys.safe_repeat_window(policy, status),
                random_fraction=workflow.random().random,
            )
            if not isinstance(decision, RetryStep) and decision.budget_exhausted:
                count_event("onceflow_budget_exhausted", tool=step.tool, then=decision.kind)
            if isinstance(decision, RetryStep):
                # The retry takes its place in the task-wide budget now, not when it is
                # made: calls running side by side decide one at a time, each seeing the
                # retries the others have decided, so N calls spend at most N + B.
                if not self._run.started_on_0_1_0:  # 0.1.0 counted each attempt as it ended
                    self._memory.budgeted_attempts += 1
                    reserved = True
                status.state = StepState.BACKING_OFF
                # The backoff ends early when the key's window closes meanwhile: the
                # step then looks up and parks at once rather than after the backoff.
                with contextlib.suppress(TimeoutError):
                    await workflow.wait_condition(
                        lambda: not self._keys.is_open(status),
                        timeout=decision.delay,
                        timeout_summary=ClearText(f"backoff before retrying step {step.step_id}"),
                    )
                closed = (
                    self._keys.send_by_passed_on_0_1_0(policy, status)
                    if self._run.started_on_0_1_0
                    else self._keys.why_closed(policy, status)
                )
                if closed is not None:
                    if reserved:
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
                self._book.stop_step(
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
        found = await self._look_ups.look_up(step, policy, status)
        if found is not None:
            status.evidence["looked_up_because"] = reason
            self._book.finish_step(status, found.resource_id, found.result)
            return True
        if key_unusable is not None:
            self._run.unusable_keys[status.step_id] = key_unusable
            self._keys.stop(status.step_id)  # the key is done with: no timer waits
        finding = await self._park(status, reason)
        new_key = self._keys.old_key_unusable(status)
        why_unusable = self._run.unusable_keys.pop(status.step_id, None)
        if finding.decision is ReconcileDecision.DID_NOT_HAPPEN and new_key:
            # Sending the old key again could not make progress (the provider replays
            # its stored failure) or could make a second effect (it may have forgotten
            # the key): the operator's attempt goes out under a new key.
            if self._run.started_on_0_1_0:
                workflow.deprecate_patch(KEY_GENERATIONS)
            if why_unusable is not KeyUnusable.STORED_FAILURE:
                # A stored failure proves the provider finished with the old key; past
                # its send-by, its last request may still be held there and commit.
                if self._run.started_on_0_1_0:
                    workflow.deprecate_patch(OLD_KEY_SETTLES)
                late = await self._old_key_settled(step, policy, status)
                if late is not None:
                    status.evidence["found_after_decision"] = "true"
                    self._book.finish_step(status, late.resource_id, late.result)
                    return True
            self._keys.stop(status.step_id)
            status.key_generation += 1
            status.evidence["key_generation"] = str(status.key_generation)
        if finding.decision is ReconcileDecision.HAPPENED:
            verified = self._run.verified.pop(status.step_id, None)
            result = {**verified.result, "reconciled": True} if verified else {"reconciled": True}
            self._book.finish_step(status, finding.resource_id, result)
            return True
        if finding.decision is ReconcileDecision.ABANDON:
            self._book.stop_step(
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
        # Always a timer, however little is left: whether any is left reads the clock,
        # which a replay may read otherwise; the timer's length is no decision. (0.1.0
        # compared the clock, and its tasks still do.)
        if not self._run.started_on_0_1_0 or workflow.now() < settled_at:
            status.state = StepState.BACKING_OFF
            status.evidence["old_key_settles_at"] = settled_at.isoformat()
            await workflow.sleep(
                max(settled_at - workflow.now(), MIN_TIMER),
                summary=ClearText(
                    f"let step {step.step_id}'s last request under its old key settle at "
                    "the provider before a new key is sent"
                ),
            )
        return await self._look_ups.look_up(
            step, policy, status, why="once the old key's requests have settled"
        )

    def _require_tool(self, step: StepInput) -> None:
        """Fail the workflow task when it would send an attempt of a tool this worker
        lacks: Temporal retries it (the UI shows why) until a worker with the tool takes
        it, and no attempt is spent on a worker that cannot run it.

        Asked only live, right before an attempt is scheduled: everything else (a replay,
        the status query, decisions, look-ups) reads history and the pinned policy, never
        this worker's catalogue, so a worker without the tool still replays and decides
        for the tasks that used it. A failed workflow task records nothing, so asking
        only live cannot make a replay differ."""
        if step.tool not in self._catalogue:
            raise ToolNotOnThisWorker(
                f"this worker cannot run step {step.step_id}'s next attempt: tool "
                f"{step.tool!r} is not registered on it. Deploy a worker that serves it "
                "(the same ONCEFLOW_BUILTIN_TOOLS, ONCEFLOW_TOOLS and tool settings on every "
                "worker of the task queue); the task goes on as soon as one takes it"
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
        self._keys.open_for(policy, status)
        send_by = None if operator_authorised else self._keys.send_by(policy, status)
        wait_for_worker = (
            max(send_by - started_at, timedelta(seconds=1)) if send_by is not None else None
        )
        call = tool_call_input(
            self._task,
            step,
            policy,
            status,
            attempt=attempt,
            deliberate_repeat=status.deliberate_repeat,
            send=self._send_kind(status, operator_authorised),
        )
        result = await self._send(step, policy, call, send_by, wait_for_worker)
        while result.provider_hold is not None and await self._wait_for_provider(
            step, policy, status, result.provider_hold
        ):
            result = await self._send(step, policy, call, send_by, wait_for_worker)
        count_event("onceflow_attempts", tool=step.tool, outcome=result.outcome.value)
        waited_for_database = result.database_unavailable
        if waited_for_database and self._run.started_on_0_1_0:
            workflow.deprecate_patch(DATABASE_WAITS)
        free = (
            waited_for_database
            or result.throttled_for is not None
            or result.provider_hold is not None
        )
        if operator_authorised:
            self._memory.operator_authorised_attempts += 1
        elif reserved:
            if free:
                self._memory.budgeted_attempts -= 1  # not the provider's doing: give it back
        elif not free and (self._task.open is None or attempt > 1):
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
                throttled=result.throttled_for is not None,
                held_by_provider=result.provider_hold is not None,
            )
        )
        status.evidence.update(result.evidence)
        return result

    @staticmethod
    def _send_kind(status: StepStatus, operator_authorised: bool) -> Send:
        """What the attempt is to its provider's budget: a retry once an earlier attempt
        of the step may have reached the provider."""
        if operator_authorised:
            return Send.OPERATOR
        reached = any(
            not (attempt.database_unavailable or attempt.held_by_provider)
            for attempt in status.attempts
        )
        return Send.RETRY if reached else Send.FIRST

    async def _wait_for_provider(
        self, step: StepInput, policy: ToolPolicy, status: StepStatus, hold: ProviderHold
    ) -> bool:
        """Wait, off the task's clock, until asking the provider's budget again can help;
        False once the step has waited its provider wait limit."""
        left = policy.provider_wait_limit - status.provider_waited
        if left <= timedelta(0):
            return False
        # Spread the steps that were held together, so they do not ask at one instant.
        spread = 1 + PROVIDER_RECHECK_SPREAD * workflow.random().random()
        delay = min(max(hold.recheck_in, MIN_PROVIDER_RECHECK) * spread, left)
        status.state = StepState.BACKING_OFF
        status.waiting_for_provider = hold.reason
        self._run.changed = True
        self._book.show_details(f"step {step.step_id} ({step.tool}): {hold.reason}")
        began = workflow.now()
        self._book.begin_off_the_clock()
        await workflow.sleep(
            delay, summary=ClearText(f"wait for {hold.provider} ({hold.health.value})")
        )
        self._book.end_off_the_clock()
        status.provider_waited += workflow.now() - began
        status.state = StepState.RUNNING
        status.waiting_for_provider = None
        self._run.changed = True
        self._book.show_details("")
        return True

    async def _send(
        self,
        step: StepInput,
        policy: ToolPolicy,
        call: ToolCallInput,
        send_by: datetime | None,
        wait_for_worker: timedelta | None,
    ) -> ToolAttemptResult:
        """Run the attempt's activity once; its failure as a classified result."""
        if not workflow.unsafe.is_replaying():
            self._require_tool(step)
        try:
            result = await execute_once(
                step.tool,
                call,
                f"{step.tool} · step {step.step_id} · attempt {call.attempt}",
                schedule_to_start_timeout=wait_for_worker,
                heartbeat_timeout=policy.heartbeat_timeout,
            )
        except ActivityError as failure:
            result = ToolAttemptResult(
                outcome=OutcomeClass.UNKNOWN, reason=describe_activity_failure(failure)
            )
            if send_by is not None and not_started_in_time(failure):
                result = ToolAttemptResult(
                    outcome=OutcomeClass.TRANSIENT,
                    reason=(
                        "no worker started the attempt before the send-by deadline of the "
                        f"step's key ({send_by.isoformat(timespec='seconds')}), so nothing "
                        "was sent: the provider may have forgotten the key"
                    ),
                    key_unusable=KeyUnusable.SEND_BY_PASSED,
                )
            elif not_registered(failure):
                if self._run.started_on_0_1_0:
                    workflow.deprecate_patch(UNREGISTERED_ACTIVITY_IS_TRANSIENT)
                result = ToolAttemptResult(
                    outcome=OutcomeClass.TRANSIENT,
                    reason=(
                        f"the worker that took the attempt has no tool {step.tool!r}, so "
                        "nothing ran; load it on every worker of the task queue (ONCEFLOW_TOOLS)"
                    ),
                )
        return result

    async def _await_approval(self, status: StepStatus, *, now: datetime | None = None) -> None:
        status.state = StepState.AWAITING_APPROVAL
        self._book.set_state(TaskState.AWAITING_APPROVAL)
        self._book.show_details(approval_details(status))
        self._book.begin_waiting_for_people(now)
        await workflow.wait_condition(lambda: status.step_id in self._run.approvals)
        self._book.end_waiting_for_people()
        approval = self._run.approvals[status.step_id]
        self._book.show_details("")
        if not approval.approved:
            self._book.stop_step(
                status,
                StepState.DENIED,
                f"step {status.step_id} denied by {approval.approver}: {approval.reason}",
            )
        status.state = StepState.RUNNING  # approved: what a call asking now is told
        self._book.set_state(TaskState.RUNNING)
        await self._book.act_durably()

    async def _park(self, status: StepStatus, reason: str) -> ReconcileInput:
        workflow_id = workflow.info().workflow_id
        status.state = StepState.PARKED
        status.park_reason = reason
        status.reconcile_command = (
            f"onceflow reconcile {workflow_id} --step {status.step_id} "
            "--decision happened|did_not_happen|abandon [--resource-id ID] --reason TEXT"
        )
        self._book.set_state(TaskState.PARKED)
        count_event("onceflow_tasks_parked", tool=status.tool)
        self._book.show_details(park_details(status))
        self._book.begin_waiting_for_people()
        await self._decisions.await_reconciliation(status.step_id)
        self._book.end_waiting_for_people()
        finding = self._run.reconciliations.pop(status.step_id)
        # Decided: no longer parked, even while a look-up or a settle wait follows.
        status.state = StepState.RUNNING
        status.park_reason = None
        status.reconcile_command = None
        self._book.show_details("")
        self._book.set_state(TaskState.RUNNING)
        await self._book.act_durably()
        return finding
