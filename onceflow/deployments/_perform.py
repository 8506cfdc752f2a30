"""Performs ``start_deployment`` under a fenced lease on the deployment's operation.

One attempt::

    deployment id = the step's child key for "deploy" at the target account
      │
      ├─ recorded 'succeeded' ─▶ report it (no write)     recorded 'failed' ─▶ rejected
      ├─ take the operation's lease: token + 1 once it is free or expired; a live lease
      │  is waited for, heartbeating, then transient (ChildOperation.fenced_lease)
      ├─ open the deployments row under the token; for each step not yet done (the row's
      │  steps_done, whoever did them):
      │     write it at the target carrying the token      (the target fences it)
      │     record steps_done under the token               (fenced_transaction)
      │  while the lease's keeper heartbeats the progress and extends the lease
      └─ commit: the row and the operation 'succeeded' in one transaction, still fenced

Every local write checks the token it holds; a write whose token is no longer the
operation's is refused and logged, and the attempt ends ``unknown`` (safe: a repeat is
fenced too).
"""

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from onceflow.deployments._contract import DEPLOYMENT_STEPS, StartDeploymentInput
from onceflow.deployments._settings import DeploymentToolSettings
from onceflow.deployments._target import DeployTarget, DeployTargetError, StepWrite
from onceflow.tools import (
    ChildOperation,
    Lease,
    LeaseLost,
    NothingSent,
    OutcomeClass,
    ToolAttemptResult,
    ToolCall,
    classify_database_error,
)

DEPLOY_CHILD_OP = "deploy"
"""Child operation name of a deployment in its derived key (the deployment id)."""

_log = logging.getLogger(__name__)

_OPEN = """
INSERT INTO deployments (deployment_id, tenant, workflow_id, step_id, service, version,
                         environment, state, fencing_token, owner)
VALUES (%(deployment_id)s, %(tenant)s, %(workflow_id)s, %(step_id)s, %(service)s, %(version)s,
        %(environment)s, 'running', %(token)s, %(owner)s)
ON CONFLICT (deployment_id) DO UPDATE
SET fencing_token = EXCLUDED.fencing_token, owner = EXCLUDED.owner, updated_at = now()
WHERE deployments.state = 'running'
RETURNING steps_done
"""
_STATE = (
    "SELECT state, last_report, steps_done FROM deployments WHERE deployment_id = %(deployment_id)s"
)
_RECORD = """
UPDATE deployments
SET steps_done = %(steps_done)s, state = %(state)s, last_report = %(report)s,
    fencing_token = %(token)s, owner = %(owner)s,
    finished_at = CASE WHEN %(state)s = 'running' THEN NULL ELSE now() END,
    updated_at = now()
WHERE deployment_id = %(deployment_id)s AND state = 'running'
RETURNING deployment_id
"""


class _FencedOut(Exception):
    """A newer token holds the deployment; this attempt may write nothing more."""


@dataclass
class _Progress:
    """How far this attempt's deployment got, for heartbeats, evidence and the row."""

    deployment_id: str
    token: int = 0
    owner: str = ""
    steps_done: int = 0
    step: str | None = None

    def details(self) -> dict[str, Any]:
        """Heartbeat details besides token and owner: the Temporal UI shows them."""
        return {
            "deployment_id": self.deployment_id,
            "steps_done": self.steps_done,
            "steps": len(DEPLOYMENT_STEPS),
            "step": self.step,
        }

    def evidence(self) -> dict[str, str]:
        """What the step keeps for operators (and records with the operation)."""
        return {
            "deployment_id": self.deployment_id,
            "fencing_token": str(self.token),
            "steps_done": f"{self.steps_done}/{len(DEPLOYMENT_STEPS)}",
            "lease_owner": self.owner,
        }


class FencedDeploying:
    """``start_deployment``'s perform, bound to the lease timing the contract was built from.

    Its client is the deployment target (``DeployTarget``); None when
    ``DEPLOY_TARGET_URL`` is unset, in which case every call is rejected with a reason.

    Args:
        settings: Lease TTL (and, through the contract, heartbeat timeout).
    """

    def __init__(self, settings: DeploymentToolSettings) -> None:
        self._settings = settings

    async def start_deployment(self, call: ToolCall[StartDeploymentInput]) -> ToolAttemptResult:
        """Run the step's deployment to the end under a fenced lease.

        The documented result: ``deployment_id``, ``service``, ``version``,
        ``environment``, ``fencing_token`` (of the attempt that finished it), ``steps``
        and ``replayed`` (true when an earlier attempt had finished it).
        """
        target: DeployTarget | None = call.client
        if target is None:
            return ToolAttemptResult(
                outcome=OutcomeClass.REJECTED,
                reason="no deployment target is configured (DEPLOY_TARGET_URL is unset)",
            )
        operation = await call.begin(DEPLOY_CHILD_OP, provider_account=target.account)
        finished = _finished_earlier(operation)
        if finished is not None:
            return finished
        progress = _Progress(deployment_id=operation.key)
        try:
            async with operation.fenced_lease(ttl=self._settings.lease_ttl) as lease:
                progress.token, progress.owner = lease.token, lease.owner
                return await _deploy(call, operation, lease, target, progress)
        except LeaseLost as lost:
            _refused(progress, "extending the lease", lost)
            return _fenced(progress, "the lease was taken over")
        except NothingSent as not_taken:
            # Another attempt held the lease all along; it may have finished meanwhile.
            finished = _finished_earlier(
                await call.find(DEPLOY_CHILD_OP, provider_account=target.account)
            )
            if finished is not None:
                return finished
            return await operation.failed(
                OutcomeClass.TRANSIENT, str(not_taken), evidence={"deployment_id": operation.key}
            )


async def _deploy(
    call: ToolCall[StartDeploymentInput],
    operation: ChildOperation,
    lease: Lease,
    target: DeployTarget,
    progress: _Progress,
) -> ToolAttemptResult:
    arguments = call.args
    try:
        ended = await _open(call, operation, lease, progress)
        if ended is not None:
            return ended
        for index in range(progress.steps_done, len(DEPLOYMENT_STEPS)):
            progress.step = DEPLOYMENT_STEPS[index]
            lease.progress.update(progress.details())
            call.heartbeat(lease.heartbeat_details())
            try:
                await target.apply_step(
                    StepWrite(
                        deployment_id=progress.deployment_id,
                        step=progress.step,
                        fencing_token=lease.token,
                        owner=lease.owner,
                        service=arguments.service,
                        version=arguments.version,
                        environment=arguments.environment,
                    )
                )
            except DeployTargetError as refused:
                return await _stop(operation, lease, progress, refused)
            progress.steps_done = index + 1
            await _record(
                operation, lease, progress, state="running", report=f"{progress.step} applied"
            )
        progress.step = None
        lease.progress.update(progress.details())
        return await _commit(call, operation, lease, progress)
    except _FencedOut as fenced:
        return _fenced(progress, str(fenced))
    except asyncio.CancelledError:
        if not lease.lost:
            # Temporal gave up on this attempt (heartbeat timeout, cancellation): leave
            # the progress under our token (a newer owner's token refuses this write);
            # the lease is released on the way out for the next attempt.
            with contextlib.suppress(Exception):
                await _record(
                    operation,
                    lease,
                    progress,
                    state="running",
                    report=f"attempt cancelled at {progress.step}",
                )
        raise
    except Exception as error:
        outcome, reason = classify_database_error(error)
        return await operation.failed(outcome, reason, evidence=progress.evidence())


async def _open(
    call: ToolCall[StartDeploymentInput],
    operation: ChildOperation,
    lease: Lease,
    progress: _Progress,
) -> ToolAttemptResult | None:
    """Create the deployments row, or take it over under our token; None to go on."""
    arguments = call.args
    params = {
        "deployment_id": progress.deployment_id,
        "tenant": call.tenant,
        "workflow_id": call.workflow_id,
        "step_id": call.step_id,
        "service": arguments.service,
        "version": arguments.version,
        "environment": arguments.environment,
        "token": lease.token,
        "owner": lease.owner,
    }
    try:
        async with operation.fenced_transaction(lease) as conn:
            opened = await (await conn.execute(_OPEN, params)).fetchone()
            current = None if opened else await (await conn.execute(_STATE, params)).fetchone()
    except LeaseLost as lost:
        raise _FencedOut(_refused(progress, "opening the deployment", lost)) from None
    if opened is not None:
        progress.steps_done = int(opened[0])
        lease.progress.update(progress.details())
        call.heartbeat(lease.heartbeat_details())
        return None
    if current is None:
        raise LookupError("the deployment row vanished")
    state, report, steps_done = current
    progress.steps_done = int(steps_done)
    if state == "failed":
        return await operation.failed(
            OutcomeClass.REJECTED,
            f"the deployment failed earlier: {report}",
            evidence=progress.evidence(),
        )
    # The row finished but its operation was not marked: record what the row says.
    return await _commit(call, operation, lease, progress, row_finished=True)


async def _stop(
    operation: ChildOperation, lease: Lease, progress: _Progress, refused: DeployTargetError
) -> ToolAttemptResult:
    """Record why the target refused, under our token, and end the attempt."""
    final = refused.outcome is OutcomeClass.REJECTED
    try:
        await _record(
            operation,
            lease,
            progress,
            state="failed" if final else "running",
            report=refused.reason,
        )
    except _FencedOut as fenced:
        return _fenced(progress, f"{refused.reason}; {fenced}")
    except Exception as error:
        _, why = classify_database_error(error)
        return ToolAttemptResult(
            outcome=OutcomeClass.UNKNOWN,
            reason=f"{refused.reason}; recording it failed: {why}",
            evidence={**operation.evidence, **progress.evidence()},
        )
    return await operation.failed(refused.outcome, refused.reason, evidence=progress.evidence())


async def _record(
    operation: ChildOperation, lease: Lease, progress: _Progress, *, state: str, report: str
) -> None:
    """One fenced write of the row; raises ``_FencedOut`` when our token is stale."""
    try:
        async with operation.fenced_transaction(lease) as conn:
            await _write_row(conn, lease, progress, state=state, report=report)
    except LeaseLost as lost:
        raise _FencedOut(_refused(progress, f"recording '{report}'", lost)) from None


async def _commit(
    call: ToolCall[StartDeploymentInput],
    operation: ChildOperation,
    lease: Lease,
    progress: _Progress,
    *,
    row_finished: bool = False,
) -> ToolAttemptResult:
    """The row and the operation succeed in one transaction, under our token."""
    arguments = call.args

    async def mark_succeeded(conn: AsyncConnection[Any]) -> None:
        if not row_finished:
            await _write_row(conn, lease, progress, state="succeeded", report="all steps applied")

    result = {
        "deployment_id": progress.deployment_id,
        "service": arguments.service,
        "version": arguments.version,
        "environment": arguments.environment,
        "fencing_token": lease.token,
        "steps": list(DEPLOYMENT_STEPS),
        "replayed": False,
    }
    try:
        recorded = progress.evidence()
        committed = await operation.commit_local_effect(
            mark_succeeded,
            progress.deployment_id,
            result,
            lease=lease,
            deployment_id=recorded["deployment_id"],
            fencing_token=recorded["fencing_token"],
            steps_done=recorded["steps_done"],
            lease_owner=recorded["lease_owner"],
        )
    except LeaseLost as lost:
        raise _FencedOut(_refused(progress, "recording 'all steps applied'", lost)) from None
    call.heartbeat(lease.heartbeat_details())
    return committed


async def _write_row(
    conn: AsyncConnection[Any], lease: Lease, progress: _Progress, *, state: str, report: str
) -> None:
    cursor = await conn.execute(
        _RECORD,
        {
            "deployment_id": progress.deployment_id,
            "token": lease.token,
            "owner": lease.owner,
            "steps_done": progress.steps_done,
            "state": state,
            "report": report,
        },
    )
    if await cursor.fetchone() is None:
        raise _FencedOut(f"the deployment is no longer running (recording '{report}')")


def _finished_earlier(operation: ChildOperation) -> ToolAttemptResult | None:
    """What an earlier attempt's end means for this one: its success, or its refusal."""
    success = operation.earlier_success
    if success is not None:
        return success.model_copy(update={"result": {**success.result, "replayed": True}})
    if operation.state == "failed":
        return ToolAttemptResult(
            outcome=OutcomeClass.REJECTED,
            reason=f"the deployment failed earlier: {operation.result.get('reason')}",
            evidence=operation.evidence,
        )
    return None


def _refused(progress: _Progress, what: str, lost: LeaseLost) -> str:
    message = f"local write refused ({what}): {lost}"
    _log.warning("deployment %s: %s", progress.deployment_id, message)
    return message


def _fenced(progress: _Progress, reason: str) -> ToolAttemptResult:
    return ToolAttemptResult(
        outcome=OutcomeClass.UNKNOWN,
        reason=f"fenced out: {reason}",
        evidence=progress.evidence(),
    )
