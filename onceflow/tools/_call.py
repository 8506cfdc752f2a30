"""What a custom tool's implementation gets for one attempt: its arguments, its identity,
its client, child operations with derived keys and persisted correlation ids, heartbeats.

A child operation's record lives in onceflow's ``operations`` table, keyed by the derived
child key, so every attempt of the same step (in any worker) sees what earlier ones
learnt::

    (none) --begin--> started --succeeded--> succeeded   (a later attempt replays it)
                         |----failed(rejected)--> failed
"""

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, TypeVar

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel
from temporalio import activity

from onceflow.retry_policy import OutcomeClass
from onceflow.tools._attempts import ToolAttemptResult, ToolCallInput
from onceflow.tools._classify import NothingSent
from onceflow.tools._contract import ToolContract
from onceflow.tools._identity import derive_child_key, key_digest
from onceflow.tools._lease import Lease, hold_lease

ArgsT = TypeVar("ArgsT", bound=BaseModel)

_log = logging.getLogger(__name__)

_READ = """
SELECT state, resource_id, result, correlation FROM operations WHERE child_key = %(child_key)s
"""
_START = """
INSERT INTO operations (child_key, tenant, workflow_id, step_id, tool, child_op, state)
VALUES (%(child_key)s, %(tenant)s, %(workflow_id)s, %(step_id)s, %(tool)s, %(child_op)s,
        'started')
ON CONFLICT (child_key) DO NOTHING
"""
_MERGE_CORRELATION = """
INSERT INTO operations
    (child_key, tenant, workflow_id, step_id, tool, child_op, state, correlation)
VALUES (%(child_key)s, %(tenant)s, %(workflow_id)s, %(step_id)s, %(tool)s, %(child_op)s,
        'started', %(ids)s)
ON CONFLICT (child_key) DO UPDATE
SET correlation = operations.correlation || EXCLUDED.correlation, updated_at = now()
"""
_SUCCEEDED = """
INSERT INTO operations
    (child_key, tenant, workflow_id, step_id, tool, child_op, state, resource_id, result,
     correlation)
VALUES (%(child_key)s, %(tenant)s, %(workflow_id)s, %(step_id)s, %(tool)s, %(child_op)s,
        'succeeded', %(resource_id)s, %(result)s, %(ids)s)
ON CONFLICT (child_key) DO UPDATE
SET state = 'succeeded', resource_id = EXCLUDED.resource_id, result = EXCLUDED.result,
    correlation = operations.correlation || EXCLUDED.correlation, updated_at = now()
"""
_FAILED = """
UPDATE operations SET state = 'failed', result = %(result)s,
    correlation = correlation || %(ids)s, updated_at = now()
WHERE child_key = %(child_key)s AND state <> 'succeeded'
"""
DEFAULT_HEARTBEAT_EVERY = timedelta(seconds=10)
"""How often ``keep_alive`` heartbeats when the contract sets no ``heartbeat_timeout``."""
DEFAULT_LEASE_TTL = timedelta(seconds=30)
"""How long a ``fenced_lease`` outlives a holder that stopped extending it."""


@dataclass
class ChildOperation:
    """One child effect of a step (one request to one provider account) and its record.

    Send ``key`` as the provider's idempotency key. Report the end with ``succeeded``
    or ``failed``; both persist what the attempt learnt before the step may finish.
    """

    key: str
    """The derived child key: the same for every attempt of this step and child op."""
    child_op: str
    """Which child effect of the step this is (e.g. ``create``, ``notify``)."""
    state: str | None
    """``started``, ``succeeded`` or ``failed`` as recorded so far; None if never begun."""
    correlation: dict[str, str]
    """Provider ids recorded by this and earlier attempts (request ids, resource ids)."""
    resource_id: str | None = None
    """The resource an earlier attempt recorded as produced, if it succeeded."""
    result: dict[str, Any] = field(default_factory=dict)
    """The result an earlier attempt recorded, if it succeeded."""
    _call: "ToolCall[Any] | None" = field(default=None, repr=False)

    @property
    def key_digest(self) -> str:
        """A digest of ``key``, safe to log, trace and send as provider metadata."""
        return key_digest(self.key)

    @property
    def earlier_success(self) -> ToolAttemptResult | None:
        """The recorded success of an earlier attempt, to return as it is; else None."""
        if self.state != "succeeded":
            return None
        return ToolAttemptResult(
            outcome=OutcomeClass.SUCCEEDED,
            resource_id=self.resource_id,
            result=self.result,
            evidence={**self.evidence, "found_by": "local_record"},
        )

    @property
    def evidence(self) -> dict[str, str]:
        """What the workflow keeps for lookups and operators: key digest and provider ids."""
        return {f"{self.child_op}_key_digest": self.key_digest, **self.correlation}

    async def record(self, **ids: str) -> None:
        """Persist provider correlation ids now (e.g. a request id as soon as it is known).

        Raises the database's error when it cannot; from inside a tool that ends the
        attempt as ``unknown``, which is right after a request was sent.
        """
        self.correlation.update(_strings(ids))
        await self._pool_execute(_MERGE_CORRELATION, ids=Jsonb(_strings(ids)))

    async def succeeded(
        self, resource_id: str, result: dict[str, Any] | None = None, **ids: str
    ) -> ToolAttemptResult:
        """Record the success with its ids and return it as this attempt's result.

        If the record cannot be written the attempt is ``unknown`` (the effect exists but
        nobody could find it again); the next attempt repeats with the same key.
        """
        self.correlation.update(_strings(ids))
        body = dict(result or {})
        try:
            await self._pool_execute(
                _SUCCEEDED, resource_id=resource_id, result=Jsonb(body), ids=Jsonb(self.correlation)
            )
        except Exception as error:
            return ToolAttemptResult(
                outcome=OutcomeClass.UNKNOWN,
                reason=(
                    f"{resource_id} was made but could not be recorded ({type(error).__name__})"
                ),
                evidence={**self.evidence, "resource_id": resource_id},
            )
        self.state, self.resource_id, self.result = "succeeded", resource_id, body
        return ToolAttemptResult(
            outcome=OutcomeClass.SUCCEEDED,
            resource_id=resource_id,
            result=body,
            evidence=self.evidence,
        )

    async def failed(self, outcome: OutcomeClass, reason: str, **ids: str) -> ToolAttemptResult:
        """Return a failed attempt's result; a ``rejected`` one is recorded as failed.

        Correlation ids are kept on a best-effort basis: the failure is reported either way.
        """
        if outcome is OutcomeClass.SUCCEEDED:
            raise ValueError("use succeeded() for a success")
        self.correlation.update(_strings(ids))
        statement = _FAILED if outcome is OutcomeClass.REJECTED else _MERGE_CORRELATION
        try:
            await self._pool_execute(
                statement, result=Jsonb({"reason": reason}), ids=Jsonb(self.correlation)
            )
        except Exception:
            _log.warning("could not record the failure of %s", self.key_digest)
        return ToolAttemptResult(outcome=outcome, reason=reason, evidence=self.evidence)

    def fenced_lease(
        self, ttl: timedelta = DEFAULT_LEASE_TTL
    ) -> AbstractAsyncContextManager[Lease]:
        """Hold this operation alone for the block (use with ``DedupeStrategy.FENCED_LEASE``).

        Send ``lease.token`` with every write to the far side, which must refuse a token
        lower than the highest it has seen. The lease is extended (and the attempt
        heartbeats) every ``ttl / 3``; if another attempt took it over after it lapsed,
        the block is cancelled and ``LeaseLost`` raised (the attempt ends ``unknown``).
        While another attempt holds a live lease this waits up to two TTLs, then raises
        ``NothingSent`` (``transient``). Call ``begin`` first.

        Args:
            ttl: How long the lease outlives a silent holder. Default ``DEFAULT_LEASE_TTL``.
        """
        if self._call is None:
            raise RuntimeError("this child operation is not bound to a call")
        return hold_lease(self._call.pool, self.key, ttl=ttl, attempt=self._call.attempt)

    async def _pool_execute(self, statement: str, **params: Any) -> None:
        if self._call is None:
            raise RuntimeError("this child operation is not bound to a call")
        async with self._call.pool.connection() as conn:
            await conn.execute(statement, {**self._call.operation_params(self), **params})


@dataclass(frozen=True)
class ToolCall(Generic[ArgsT]):
    """One attempt at one step, as a custom tool sees it."""

    args: ArgsT
    """The validated arguments: an instance of the contract's ``input_model``."""
    identity: ToolCallInput
    """Tenant, workflow id, step id, attempt number and what earlier attempts reported."""
    client: Any
    """What the tool's ``open_client`` yielded; None without one."""
    contract: ToolContract
    """The tool's contract as registered."""
    pool: AsyncConnectionPool
    """onceflow's database pool; the tool's own tables may use it too."""

    @property
    def tenant(self) -> str:
        """The tenant owning the task."""
        return self.identity.tenant

    @property
    def workflow_id(self) -> str:
        """The task's workflow id, stable across attempts and workflow runs."""
        return self.identity.workflow_id

    @property
    def step_id(self) -> str:
        """The step inside the task."""
        return self.identity.step_id

    @property
    def attempt(self) -> int:
        """1-based attempt number, for logs only: never part of a key."""
        return self.identity.attempt

    @property
    def evidence(self) -> dict[str, str]:
        """What earlier attempts of this step reported (key digests, provider ids)."""
        return self.identity.evidence

    def child_key(self, child_op: str, *, provider_account: str) -> str:
        """The derived idempotency key of one child operation at one provider account."""
        return derive_child_key(
            tenant=self.tenant,
            workflow_id=self.workflow_id,
            step_id=self.step_id,
            child_op=child_op,
            provider_account=provider_account,
        )

    async def begin(self, child_op: str, *, provider_account: str) -> ChildOperation:
        """Start (or resume) a child operation: record it before anything is sent.

        Returns the operation with what earlier attempts recorded; if one succeeded,
        return ``operation.earlier_success`` instead of sending again.

        Raises:
            NothingSent: The record could not be read or written; as nothing was sent,
                the attempt ends as ``transient``.
        """
        return await self._load(child_op, provider_account, start=True)

    async def find(self, child_op: str, *, provider_account: str) -> ChildOperation:
        """A child operation's record without starting it: for ``look_up`` functions."""
        return await self._load(child_op, provider_account, start=False)

    def heartbeat(self, *details: Any) -> None:
        """Tell Temporal this attempt is alive (and how far it got)."""
        activity.heartbeat(*details)

    @asynccontextmanager
    async def keep_alive(self, every: timedelta | None = None) -> AsyncIterator[None]:
        """Heartbeat in the background while the block runs (a long poll, an upload).

        Args:
            every: Time between heartbeats. Default: a third of the contract's
                ``heartbeat_timeout``, or ``DEFAULT_HEARTBEAT_EVERY`` without one.
        """
        timeout = self.contract.heartbeat_timeout
        interval = every or (timeout / 3 if timeout else DEFAULT_HEARTBEAT_EVERY)

        async def beat() -> None:
            while True:
                activity.heartbeat()
                await asyncio.sleep(interval.total_seconds())

        beating = asyncio.create_task(beat())
        try:
            yield
        finally:
            beating.cancel()
            await asyncio.gather(beating, return_exceptions=True)

    def operation_params(self, operation: ChildOperation) -> dict[str, str]:
        """The identity columns of ``operation``'s record."""
        return {
            "child_key": operation.key,
            "tenant": self.tenant,
            "workflow_id": self.workflow_id,
            "step_id": self.step_id,
            "tool": self.contract.name,
            "child_op": operation.child_op,
        }

    async def _load(self, child_op: str, provider_account: str, *, start: bool) -> ChildOperation:
        key = self.child_key(child_op, provider_account=provider_account)
        params = self.operation_params(
            ChildOperation(key=key, child_op=child_op, state=None, correlation={})
        )
        try:
            async with self.pool.connection() as conn:
                if start:
                    await conn.execute(_START, params)
                row = await (await conn.execute(_READ, params)).fetchone()
        except Exception as error:
            raise NothingSent(
                f"could not record {child_op!r} before sending ({type(error).__name__})"
            ) from error
        if row is None:
            return ChildOperation(
                key=key, child_op=child_op, state=None, correlation={}, _call=self
            )
        state, resource_id, result, correlation = row
        return ChildOperation(
            key=key,
            child_op=child_op,
            state=state,
            correlation=_strings(correlation),
            resource_id=resource_id,
            result=dict(result),
            _call=self,
        )


def _strings(ids: dict[str, Any]) -> dict[str, str]:
    return {name: str(value) for name, value in ids.items() if value is not None}
