"""Performs ``start_deployment`` under a fenced lease on the deployment's row.

One attempt::

    deployment id = derive_child_key(tenant, workflow, step, "deploy", target account)
      │
      ├─ row succeeded ─▶ report it (no write)      row failed ─▶ rejected
      ├─ acquire: create the row with token 1, or take an expired (or released) lease
      │  with token + 1; a live lease is waited for, heartbeating, then transient
      ├─ for each step not yet done (the row's steps_done, whoever did them):
      │     write it at the target carrying the token      (the target fences it)
      │     record steps_done under the token               (the row fences it)
      │  while a keeper heartbeats the progress and extends the lease under the token
      └─ commit: state succeeded where the token is still ours

Every local write names the token it holds; a write whose token is no longer the row's
is refused and logged, and the attempt ends ``unknown`` (safe: a repeat is fenced too).
"""

import asyncio
import contextlib
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from psycopg_pool import AsyncConnectionPool
from temporalio import activity

from onceflow.deployments import DeployTarget, DeployTargetError, StepWrite
from onceflow.retry_policy import OutcomeClass
from onceflow.storage import classify_database_error
from onceflow.tools import ToolAttemptResult, ToolCallInput, derive_child_key
from onceflow.tools.deployments import (
    DEPLOY_CHILD_OP,
    DEPLOYMENT_STEPS,
    DEPLOYMENT_TOOL_SETTINGS,
    START_DEPLOYMENT,
    DeploymentToolSettings,
    StartDeploymentInput,
)

_log = logging.getLogger(__name__)

_CREATE = """
INSERT INTO deployments (deployment_id, tenant, workflow_id, step_id, service, version,
                         environment, state, fencing_token, owner, lease_expires_at)
VALUES (%(deployment_id)s, %(tenant)s, %(workflow_id)s, %(step_id)s, %(service)s, %(version)s,
        %(environment)s, 'running', 1, %(owner)s, now() + %(ttl)s)
ON CONFLICT (deployment_id) DO NOTHING
RETURNING fencing_token, steps_done
"""
_TAKE_OVER = """
UPDATE deployments
SET fencing_token = fencing_token + 1, owner = %(owner)s, lease_expires_at = now() + %(ttl)s,
    updated_at = now()
WHERE deployment_id = %(deployment_id)s AND state = 'running' AND lease_expires_at <= now()
RETURNING fencing_token, steps_done
"""
_CURRENT = """
SELECT state, fencing_token, owner, steps_done, last_report,
       greatest(extract(epoch FROM lease_expires_at - now()), 0)
FROM deployments WHERE deployment_id = %(deployment_id)s
"""
_EXTEND = """
UPDATE deployments SET lease_expires_at = now() + %(ttl)s, updated_at = now()
WHERE deployment_id = %(deployment_id)s AND fencing_token = %(token)s AND state = 'running'
RETURNING deployment_id
"""
_RECORD = """
UPDATE deployments
SET steps_done = %(steps_done)s, state = %(state)s, last_report = %(report)s,
    lease_expires_at = CASE WHEN %(release)s THEN now() ELSE lease_expires_at END,
    finished_at = CASE WHEN %(state)s = 'running' THEN NULL ELSE now() END,
    updated_at = now()
WHERE deployment_id = %(deployment_id)s AND fencing_token = %(token)s AND state = 'running'
RETURNING deployment_id
"""


class _FencedOut(Exception):
    """A newer token holds the deployment; this attempt may write nothing more."""


@dataclass
class _Lease:
    """The attempt's hold on the deployment, and how far the deployment got."""

    deployment_id: str
    token: int
    owner: str
    steps_done: int
    step: str | None = None
    lost: bool = False
    """Set by the keeper when the row no longer carries this token."""
    evidence: dict[str, str] = field(default_factory=dict)

    def details(self) -> dict[str, Any]:
        """Heartbeat details: the Temporal UI shows them on the running attempt."""
        return {
            "deployment_id": self.deployment_id,
            "fencing_token": self.token,
            "steps_done": self.steps_done,
            "steps": len(DEPLOYMENT_STEPS),
            "step": self.step,
            "owner": self.owner,
        }


class DeploymentActivities:
    """The deployment tool's activity, bound to a target and the worker's pool.

    Args:
        target: The deployment target; None when ``DEPLOY_TARGET_URL`` is unset, in
            which case every call is rejected with a reason saying so.
        pool: The worker's database pool, for the ``deployments`` rows.
        settings: Lease and heartbeat timing; the ones the contract was built from.
    """

    def __init__(
        self,
        target: DeployTarget | None,
        pool: AsyncConnectionPool,
        settings: DeploymentToolSettings = DEPLOYMENT_TOOL_SETTINGS,
    ) -> None:
        self._target = target
        self._pool = pool
        self._settings = settings

    @activity.defn(name=START_DEPLOYMENT.name)
    async def start_deployment(self, call: ToolCallInput) -> ToolAttemptResult:
        """Run the step's deployment to the end under a fenced lease.

        The documented result: ``deployment_id``, ``service``, ``version``,
        ``environment``, ``fencing_token`` (of the attempt that finished it), ``steps``
        and ``replayed`` (true when an earlier attempt had finished it).
        """
        arguments = StartDeploymentInput.model_validate(call.arguments)
        if self._target is None:
            return ToolAttemptResult(
                outcome=OutcomeClass.REJECTED,
                reason="no deployment target is configured (DEPLOY_TARGET_URL is unset)",
            )
        target = self._target
        deployment_id = derive_child_key(
            tenant=call.tenant,
            workflow_id=call.workflow_id,
            step_id=call.step_id,
            child_op=DEPLOY_CHILD_OP,
            provider_account=target.account,
        )
        owner = f"{call.step_id}#{call.attempt}@{socket.gethostname()}:{os.getpid()}"
        params = {
            "deployment_id": deployment_id,
            "tenant": call.tenant,
            "workflow_id": call.workflow_id,
            "step_id": call.step_id,
            "service": arguments.service,
            "version": arguments.version,
            "environment": arguments.environment,
            "owner": owner,
            "ttl": self._settings.lease_ttl,
        }
        try:
            acquired = await self._acquire(params)
        except Exception as error:  # every failure is classified, none escapes unlabelled
            outcome, reason = classify_database_error(error)
            return ToolAttemptResult(
                outcome=outcome, reason=reason, evidence={"deployment_id": deployment_id}
            )
        if isinstance(acquired, ToolAttemptResult):
            return acquired
        return await self._deploy(target, acquired, arguments)

    # ── the lease ───────────────────────────────────────────────────────────────────

    async def _acquire(self, params: dict[str, Any]) -> "_Lease | ToolAttemptResult":
        loop = asyncio.get_running_loop()
        # A dead owner's lease is gone after one TTL; wait two, then let the workflow decide.
        deadline = loop.time() + 2 * self._settings.lease_ttl.total_seconds()
        deployment_id = params["deployment_id"]
        while True:
            async with self._pool.connection() as conn, conn.transaction():
                got = await (await conn.execute(_CREATE, params)).fetchone()
                if got is None:
                    got = await (await conn.execute(_TAKE_OVER, params)).fetchone()
                current = None if got else await (await conn.execute(_CURRENT, params)).fetchone()
            if got is not None:
                lease = _Lease(deployment_id, int(got[0]), params["owner"], int(got[1]))
                activity.heartbeat(lease.details())
                return lease
            if current is None:
                raise LookupError("the deployment row vanished")
            state, token, holder, steps_done, report, expires_in = current
            evidence = {
                "deployment_id": deployment_id,
                "fencing_token": str(token),
                "steps_done": f"{steps_done}/{len(DEPLOYMENT_STEPS)}",
            }
            if state == "succeeded":
                return _succeeded(params, int(token), evidence, replayed=True)
            if state == "failed":
                return ToolAttemptResult(
                    outcome=OutcomeClass.REJECTED,
                    reason=f"the deployment failed earlier: {report}",
                    evidence=evidence,
                )
            if loop.time() >= deadline:
                return ToolAttemptResult(
                    outcome=OutcomeClass.TRANSIENT,
                    reason=f"the lease is held by {holder} (token {token}); nothing was written",
                    evidence=evidence,
                )
            activity.heartbeat({"deployment_id": deployment_id, "waiting_for": holder})
            await asyncio.sleep(
                min(float(expires_in) + 0.05, self._settings.keep_alive_every.total_seconds())
            )

    async def _keep(self, lease: _Lease, attempt: "asyncio.Task[Any]") -> None:
        """Heartbeat the progress and extend the lease until cancelled or fenced out."""
        every = self._settings.keep_alive_every.total_seconds()
        while True:
            await asyncio.sleep(every)
            activity.heartbeat(lease.details())
            try:
                async with self._pool.connection() as conn:
                    cursor = await conn.execute(
                        _EXTEND,
                        {
                            "deployment_id": lease.deployment_id,
                            "token": lease.token,
                            "ttl": self._settings.lease_ttl,
                        },
                    )
                    extended = await cursor.fetchone() is not None
            except Exception as error:  # the lease may lapse; a newer owner fences us then
                _log.warning(
                    "deployment %s: extending the lease failed: %s", lease.deployment_id, error
                )
                continue
            if not extended:
                await self._refused(lease, "extending the lease")
                lease.lost = True
                attempt.cancel()
                return

    # ── the deployment ──────────────────────────────────────────────────────────────

    async def _deploy(
        self, target: DeployTarget, lease: _Lease, arguments: StartDeploymentInput
    ) -> ToolAttemptResult:
        attempt = asyncio.current_task()
        assert attempt is not None
        keeper = asyncio.create_task(self._keep(lease, attempt))
        try:
            for index in range(lease.steps_done, len(DEPLOYMENT_STEPS)):
                lease.step = DEPLOYMENT_STEPS[index]
                activity.heartbeat(lease.details())
                try:
                    await target.apply_step(
                        StepWrite(
                            deployment_id=lease.deployment_id,
                            step=lease.step,
                            fencing_token=lease.token,
                            owner=lease.owner,
                            service=arguments.service,
                            version=arguments.version,
                            environment=arguments.environment,
                        )
                    )
                except DeployTargetError as refused:
                    return await self._stop(lease, refused)
                lease.steps_done = index + 1
                await self._record(lease, state="running", report=f"{lease.step} applied")
            lease.step = None
            await self._record(lease, state="succeeded", report="all steps applied")
        except _FencedOut as fenced:
            return _fenced(lease, str(fenced))
        except asyncio.CancelledError:
            if not lease.lost:
                # Temporal gave up on this attempt (heartbeat timeout, cancellation): leave
                # the progress under our token and free the lease for the next attempt; a
                # newer owner's token refuses this write.
                with contextlib.suppress(_FencedOut, Exception):
                    await self._record(
                        lease,
                        state="running",
                        report=f"attempt cancelled at {lease.step}",
                        release=True,
                    )
                raise
            attempt.uncancel()
            return _fenced(lease, "the lease was taken over")
        except Exception as error:
            outcome, reason = classify_database_error(error)
            return ToolAttemptResult(outcome=outcome, reason=reason, evidence=_evidence(lease))
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
        activity.heartbeat(lease.details())
        return _succeeded(
            {"deployment_id": lease.deployment_id, **arguments.model_dump()},
            lease.token,
            _evidence(lease),
            replayed=False,
        )

    async def _stop(self, lease: _Lease, refused: DeployTargetError) -> ToolAttemptResult:
        """Record why the target refused, under our token, and end the attempt."""
        final = refused.outcome is OutcomeClass.REJECTED
        try:
            await self._record(
                lease,
                state="failed" if final else "running",
                report=refused.reason,
                release=not final,  # the next attempt may take over at once
            )
        except _FencedOut as fenced:
            return _fenced(lease, f"{refused.reason}; {fenced}")
        except Exception as error:
            _, why = classify_database_error(error)
            return ToolAttemptResult(
                outcome=OutcomeClass.UNKNOWN,
                reason=f"{refused.reason}; recording it failed: {why}",
                evidence=_evidence(lease),
            )
        return ToolAttemptResult(
            outcome=refused.outcome, reason=refused.reason, evidence=_evidence(lease)
        )

    async def _record(
        self, lease: _Lease, *, state: str, report: str, release: bool = False
    ) -> None:
        """One fenced local write; raises ``_FencedOut`` when our token is stale."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                _RECORD,
                {
                    "deployment_id": lease.deployment_id,
                    "token": lease.token,
                    "steps_done": lease.steps_done,
                    "state": state,
                    "report": report,
                    "release": release,
                },
            )
            if await cursor.fetchone() is not None:
                return
        raise _FencedOut(await self._refused(lease, f"recording '{report}'"))

    async def _refused(self, lease: _Lease, what: str) -> str:
        current: Any = None
        with contextlib.suppress(Exception):
            async with self._pool.connection() as conn:
                cursor = await conn.execute(_CURRENT, {"deployment_id": lease.deployment_id})
                current = await cursor.fetchone()
        now_at = f"token {current[1]}, {current[0]}" if current else "unknown"
        message = (
            f"local write refused ({what}): fencing token {lease.token} is stale "
            f"(the deployment is at {now_at})"
        )
        _log.warning("deployment %s: %s", lease.deployment_id, message)
        return message


def _evidence(lease: _Lease) -> dict[str, str]:
    return {
        "deployment_id": lease.deployment_id,
        "fencing_token": str(lease.token),
        "steps_done": f"{lease.steps_done}/{len(DEPLOYMENT_STEPS)}",
        "lease_owner": lease.owner,
    }


def _fenced(lease: _Lease, reason: str) -> ToolAttemptResult:
    return ToolAttemptResult(
        outcome=OutcomeClass.UNKNOWN,
        reason=f"fenced out: {reason}",
        evidence=_evidence(lease),
    )


def _succeeded(
    params: dict[str, Any], token: int, evidence: dict[str, str], *, replayed: bool
) -> ToolAttemptResult:
    return ToolAttemptResult(
        outcome=OutcomeClass.SUCCEEDED,
        resource_id=params["deployment_id"],
        result={
            "deployment_id": params["deployment_id"],
            "service": params["service"],
            "version": params["version"],
            "environment": params["environment"],
            "fencing_token": token,
            "steps": list(DEPLOYMENT_STEPS),
            "replayed": replayed,
        },
        evidence=evidence,
    )
