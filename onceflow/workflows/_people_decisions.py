"""What people decide: approvals and reconciliations, checked, recorded or refused."""

from typing import Literal

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from onceflow.retry_policy import (
        OutcomeClass,
    )
    from onceflow.tools import ToolAttemptResult
    from onceflow.tools.worker import KeyUnusable
    from onceflow.workflows.patches import UNVERIFIED_RECORDED
    from onceflow.workflows.task_models import (
        ApproveInput,
        DecisionRecord,
        DecisionResult,
        ReconcileDecision,
        ReconcileInput,
        StepInput,
        StepState,
        StepStatus,
    )
from onceflow.workflows._key_windows import KeyWindows
from onceflow.workflows._look_ups import LookUps, effect_found
from onceflow.workflows._task_book import TaskBook, describe_finding
from onceflow.workflows._task_run import DecisionCheck


class PeopleDecisions:
    """Checks and records approvals and reconciliations (Update or signal); a parked
    step waits here for its reconciliation, checking each decision sent meanwhile."""

    # One per cached task: slots, no attribute dict to hold.
    __slots__ = ("_book", "_memory", "_run", "_keys", "_look_ups")

    def __init__(self, book: TaskBook, keys: KeyWindows, look_ups: LookUps) -> None:
        self._book = book
        self._memory = book.memory
        self._run = book.run
        self._keys = keys
        self._look_ups = look_ups

    def approve_by_update(self, decision: ApproveInput) -> DecisionResult:
        """The Update ``approve``, validated by ``approval_problem``."""
        self._book.decision_admitted()
        return self._accept_approval(decision, via="update")

    def approve_by_signal(self, decision: ApproveInput) -> None:
        """The signal ``approve``: an invalid decision is only recorded."""
        problem = self.approval_problem(decision)
        if problem:
            self._record_rejected(
                "approve", decision, "approve" if decision.approved else "deny", problem
            )
            return
        self._accept_approval(decision, via="signal")

    async def reconcile_by_update(self, decision: ReconcileInput) -> DecisionResult:
        """The Update ``reconcile``, validated by ``reconciliation_problem``: a decision
        its check refuses fails the Update, recording nothing but the look-up's evidence."""
        self._book.decision_admitted()
        check = await self._decision_check(decision)
        if check.refusal is not None:
            raise ApplicationError(check.refusal, type="DecisionRefused", non_retryable=True)
        self._book.decision_admitted()  # accepted in this workflow task (see TaskBook.act_durably)
        return self._accept_reconciliation(decision, via="update", check=check)

    async def reconcile_by_signal(self, decision: ReconcileInput) -> None:
        """The signal ``reconcile``: an invalid decision, or one its check refuses, is only
        recorded."""
        problem = self.reconciliation_problem(decision)
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

    def approval_problem(self, decision: ApproveInput) -> str | None:
        status = self._memory.calls.get(decision.step_id)
        if status is None:
            return f"this task has no step {decision.step_id!r}"
        if (
            status.state is not StepState.AWAITING_APPROVAL
            or decision.step_id in self._run.approvals
        ):
            return (
                f"step {decision.step_id!r} is not awaiting approval (it is {status.state.value})"
            )
        if decision.arguments_digest != status.arguments_digest:
            return (
                f"the approval is for other arguments: step {decision.step_id!r} has "
                f"{status.arguments_digest}, the approval names {decision.arguments_digest}"
            )
        return None

    def reconciliation_problem(self, decision: ReconcileInput) -> str | None:
        status = self._memory.calls.get(decision.step_id)
        if status is None:
            return f"this task has no step {decision.step_id!r}"
        if status.state is not StepState.PARKED or decision.step_id in self._run.reconciliations:
            return f"step {decision.step_id!r} is not parked (it is {status.state.value})"
        if decision.step_id in self._run.checking:
            return (
                f"another decision on step {decision.step_id!r} is being checked with the "
                "tool's look-up; send yours again once it is answered"
            )
        return None

    async def _decision_check(self, decision: ReconcileInput) -> DecisionCheck:
        """A handler's check of its reconcile decision, run by the parked step's own
        coroutine (``await_reconciliation``): the look-up is a command, and commands
        from handlers interleave with other Updates' acceptances in an order a replay
        does not reproduce. A task started on 0.1.0 checks in the handler, as it did."""
        if self._run.started_on_0_1_0:
            return await self._check_reconciliation(decision)
        step_id = decision.step_id
        self._run.checking.add(step_id)
        try:
            self._run.check_requests[step_id] = decision
            await workflow.wait_condition(lambda: step_id in self._run.check_verdicts)
            return self._run.check_verdicts.pop(step_id)
        finally:
            self._run.checking.discard(step_id)

    async def await_reconciliation(self, step_id: str) -> None:
        """Wait, parked, for a reconciliation to be accepted; meanwhile check each
        decision sent (its look-up runs here, in the step's coroutine: an Update or
        signal handler issues no command) and hand the verdict back to its handler."""
        while step_id not in self._run.reconciliations:
            await workflow.wait_condition(
                lambda: step_id in self._run.reconciliations or step_id in self._run.check_requests
            )
            decision = self._run.check_requests.pop(step_id, None)
            if decision is not None:
                self._run.check_verdicts[step_id] = await self._check_reconciliation(decision)

    async def _check_reconciliation(self, decision: ReconcileInput) -> "DecisionCheck":
        """Check a decision against the provider before it acts (invariant 16).

        ``did_not_happen`` runs the look-up and is refused when it finds the effect;
        ``happened`` is verified by a look-up that verifies resource ids, which also
        records the resource in the step's operation record (a later refund reads it),
        unless the operator accepts it ``unverified``.
        """
        status = self._memory.calls[decision.step_id]
        step = StepInput(step_id=status.step_id, tool=status.tool, arguments=status.arguments)
        policy = self._book.policy(step.tool)
        if policy.lookup_activity is None or decision.decision is ReconcileDecision.ABANDON:
            unchecked = decision.decision is ReconcileDecision.HAPPENED
            return DecisionCheck(verified=False if unchecked else None)
        if (
            decision.decision is ReconcileDecision.HAPPENED
            and not policy.lookup_verifies_resource_ids
        ):
            return DecisionCheck(verified=False)
        if self._run.started_on_0_1_0 and decision.unverified:
            workflow.deprecate_patch(UNVERIFIED_RECORDED)
        claimed = decision.resource_id
        happened = decision.decision is ReconcileDecision.HAPPENED
        self._run.checking.add(decision.step_id)
        try:
            answer = await self._look_ups.ask(
                step,
                policy,
                status,
                claimed_resource_id=claimed,
                accept_unverified=decision.unverified and happened,
                why=f"to check {decision.operator}'s decision {decision.decision.value}",
            )
        finally:
            self._run.checking.discard(decision.step_id)
        found = effect_found(answer)
        finding = describe_finding(found) if found else status.evidence.get("lookup")
        if decision.decision is ReconcileDecision.DID_NOT_HAPPEN:
            return self._check_did_not_happen(decision, status, answer, finding)
        if decision.unverified:
            # Accepted whatever the look-up found; it recorded the resource if it could.
            return DecisionCheck(verified=False, finding=finding)
        if found is not None and found.resource_id == claimed:
            self._run.verified[decision.step_id] = found
            return DecisionCheck(verified=True, finding=finding)
        return DecisionCheck(
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
    ) -> "DecisionCheck":
        """Refused when the look-up found the effect; accepted when its miss proves the
        effect does not exist (a consistent read, or an eventual one past its lag since
        the key's last attempt) or the operator accepts it ``unverified``."""
        if answer is not None and answer.outcome is OutcomeClass.SUCCEEDED:
            return DecisionCheck(
                finding=finding,
                refusal=(
                    f"refused: step {decision.step_id}'s effect was found: {finding}; nothing "
                    f"was sent. If it is the step's, decide happened --resource-id "
                    f"{answer.resource_id}"
                ),
            )
        if decision.unverified:
            return DecisionCheck(verified=False, finding=finding)
        if self._run.started_on_0_1_0:
            return DecisionCheck(finding=finding)  # 0.1.0 took any miss, and its tasks do
        if answer is not None and answer.miss_proves_absence:
            # Past an eventual look-up's lag too: the activity judged it, and its answer
            # is in history (a clock read here might not replay).
            return DecisionCheck(verified=True, finding=finding)
        lag = answer.miss_proves_absence_after if answer is not None else None
        last = status.attempts[-1].finished_at if status.attempts else None
        wait = ""
        if lag is not None and last is not None:
            wait = f", or decide again after {(last + lag).isoformat(timespec='seconds')}"
        return DecisionCheck(
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
        self._run.approvals[decision.step_id] = decision
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
        check: "DecisionCheck | None" = None,
    ) -> DecisionResult:
        self._run.reconciliations[decision.step_id] = decision
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
        if self._keys.old_key_unusable(status):
            retry += (
                f" under a new key (generation {status.key_generation + 1}: the old key can "
                "no longer be sent)"
            )
            if self._run.unusable_keys.get(status.step_id) is not KeyUnusable.STORED_FAILURE:
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
