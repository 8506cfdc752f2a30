"""A child operation of a tool call: its record in onceflow's ``operations`` table, keyed
by the derived child key, which every attempt of the same step (in any worker) sees::

    (none) --begin--> started --succeeded / commit_local_effect--> succeeded
                         |                       (a later attempt replays it)
                         |----failed(rejected)--> failed

This module and ``_lease`` are the only places that write that table (``_audit`` reads
it, for an audit against a provider).
"""

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import AsyncConnection
from psycopg.types.json import Jsonb
from psycopg_pool import PoolTimeout

from onceflow.retry_policy import OutcomeClass
from onceflow.storage import classify_database_error
from onceflow.tools._attempts import KeyUnusable, ToolAttemptResult
from onceflow.tools._identity import key_digest
from onceflow.tools._lease import Lease, check_fence, hold_lease, lease_owner

if TYPE_CHECKING:
    from onceflow.tools._call import ToolCall

_log = logging.getLogger(__name__)

READ_OPERATION = """
SELECT state, resource_id, result, correlation FROM operations WHERE child_key = %(child_key)s
"""
MARK_FIRST_SEND = """
UPDATE operations
SET correlation = jsonb_build_object('key_first_sent_at',
        to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'))
    || correlation
WHERE child_key = %(child_key)s AND state = 'started'
    AND NOT (correlation ? 'key_first_sent_at')
"""
READ_CLOCK = "SELECT clock_timestamp()"
FIRST_SENT_AT = "key_first_sent_at"
"""Correlation id (and evidence key) of the time a child key was first sent."""
START_OPERATION = """
INSERT INTO operations
    (child_key, tenant, workflow_id, step_id, tool, child_op, state, correlation)
VALUES (%(child_key)s, %(tenant)s, %(workflow_id)s, %(step_id)s, %(tool)s, %(child_op)s,
        'started', %(ids)s)
ON CONFLICT (child_key) DO NOTHING
"""
# Every generation's record of one child operation of one step (any provider account:
# the caller keeps the rows whose key derives from its account).
READ_GENERATIONS = """
SELECT child_key, state, resource_id, result, correlation FROM operations
WHERE workflow_id = %(workflow_id)s AND step_id = %(step_id)s AND tenant = %(tenant)s
    AND child_op = %(child_op)s
"""
KEY_GENERATION = "key_generation"
"""Correlation id (and evidence key) of a child key's generation, recorded from the
second generation on."""
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
# Claims the success before the tool's own write in the same transaction: a second attempt
# racing this one waits on the row, then finds it succeeded and writes nothing.
_CLAIM_SUCCESS = """
INSERT INTO operations
    (child_key, tenant, workflow_id, step_id, tool, child_op, state, resource_id, result,
     correlation)
VALUES (%(child_key)s, %(tenant)s, %(workflow_id)s, %(step_id)s, %(tool)s, %(child_op)s,
        'succeeded', %(resource_id)s, %(result)s, %(ids)s)
ON CONFLICT (child_key) DO UPDATE
SET state = 'succeeded', resource_id = EXCLUDED.resource_id, result = EXCLUDED.result,
    correlation = operations.correlation || EXCLUDED.correlation, updated_at = now()
WHERE operations.state <> 'succeeded'
RETURNING child_key
"""
DEFAULT_HEARTBEAT_EVERY = timedelta(seconds=10)
"""How often ``keep_alive`` heartbeats when the contract sets no ``heartbeat_timeout``."""
DEFAULT_LEASE_TTL = timedelta(seconds=30)
STALE_ATTEMPT_MARGIN = timedelta(seconds=10)
"""At most this long before Temporal gives an attempt up, ``begin`` no longer sends
(a quarter of the attempt's timeout when that is shorter)."""
"""How long a ``fenced_lease`` outlives a holder that stopped extending it."""

LocalWrite = Callable[[AsyncConnection[Any]], Awaitable[None]]
"""A tool's write to onceflow's database, run inside a transaction the tool API opened."""


@dataclass
class ChildOperation:
    """One child effect of a step (one request to one provider account) and its record.

    Send ``key`` as the provider's idempotency key. Report the end with ``succeeded``
    or ``failed``; both persist what the attempt learnt before the step may finish. An
    effect in onceflow's own database ends with ``commit_local_effect`` instead: the
    write and the success commit in one transaction.
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
    generation: int = 1
    """The key generation ``key`` belongs to (see ``ToolCallInput.key_generation``)."""
    generation_keys: tuple[str, ...] = field(default=(), repr=False)
    """This operation's key in every generation up to ``generation``, oldest first."""
    _call: "ToolCall[Any] | None" = field(default=None, repr=False)

    @property
    def key_digest(self) -> str:
        """A digest of ``key``, safe to log, trace and send as provider metadata."""
        return key_digest(self.key)

    @property
    def key_digests(self) -> tuple[str, ...]:
        """Digests of this operation's key in every generation so far, oldest first. A
        look-up searches for each: an effect made under an earlier generation's key is
        still this step's."""
        return tuple(key_digest(key) for key in self.generation_keys) or (self.key_digest,)

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
        """What the workflow keeps for lookups and operators: the key's digest (as
        ``child_key_digest``, which traces and logs show, and as ``<child_op>_key_digest``,
        which keeps the child operations of one step apart) and the provider ids."""
        generation = {KEY_GENERATION: str(self.generation)} if self.generation > 1 else {}
        return {
            "child_key_digest": self.key_digest,
            f"{self.child_op}_key_digest": self.key_digest,
            **self.correlation,
            **generation,
        }

    @property
    def first_sent_at(self) -> datetime | None:
        """When the key was first sent (recorded by ``begin``), if known."""
        recorded = self.correlation.get(FIRST_SENT_AT)
        return datetime.fromisoformat(recorded) if recorded else None

    @property
    def key_expires_at(self) -> datetime | None:
        """When the provider forgets the key (first send + retention), if it does."""
        call = self._call
        first = self.first_sent_at
        if call is None or first is None or call.policy.key_retention is None:
            return None
        return first + call.policy.key_retention

    async def stored_failure(
        self,
        reason: str,
        *,
        evidence: Mapping[str, str] | None = None,
        **ids: str,
    ) -> ToolAttemptResult:
        """End the attempt after a failure the provider stores under the key and replays
        for every repeat (Stripe stores a 500): repeating cannot help, so the workflow
        looks the effect up and parks instead of spending its budget on replays.

        Args:
            reason: What the provider answered, in words an operator can act on.
            evidence: More evidence for this attempt only, not recorded. Default: none.
            **ids: Provider correlation ids, recorded with the operation.
        """
        expires = self.key_expires_at
        until = (
            f"until it forgets the key at about {expires.isoformat(timespec='seconds')}"
            if expires
            else "for as long as it keeps the key"
        )
        result = await self.failed(
            OutcomeClass.UNKNOWN,
            f"{reason}; the provider stored this failure under the step's key and replays "
            f"it for every repeat {until}, so repeating cannot help",
            evidence={
                **(evidence or {}),
                **({"key_expires_at": expires.isoformat()} if expires else {}),
            },
            **ids,
        )
        return result.model_copy(update={"key_unusable": KeyUnusable.STORED_FAILURE})

    async def record(self, **ids: str) -> None:
        """Persist provider correlation ids now (e.g. a request id as soon as it is known).

        Raises the database's error when it cannot; from inside a tool that ends the
        attempt as ``unknown``, which is right after a request was sent.
        """
        self.correlation.update(_strings(ids))
        await self._pool_execute(_MERGE_CORRELATION, ids=Jsonb(_strings(ids)))

    async def succeeded(
        self,
        resource_id: str,
        result: dict[str, Any] | None = None,
        *,
        evidence: Mapping[str, str] | None = None,
        **ids: str,
    ) -> ToolAttemptResult:
        """Record the success with its ids and return it as this attempt's result.

        If the record cannot be written the attempt is ``unknown`` (the effect exists but
        nobody could find it again); the next attempt repeats with the same key.

        Args:
            resource_id: The resource the effect produced (an order, a PaymentIntent).
            result: The tool's documented result body, recorded for later attempts.
            evidence: More evidence for this attempt only (timings, what a read saw),
                shown to operators but not recorded. Default: none.
            **ids: Provider correlation ids, recorded with the operation.
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
                evidence={**self.evidence, **(evidence or {}), "resource_id": resource_id},
            )
        return self._success(resource_id, body, evidence)

    async def failed(
        self,
        outcome: OutcomeClass,
        reason: str,
        *,
        evidence: Mapping[str, str] | None = None,
        **ids: str,
    ) -> ToolAttemptResult:
        """Return a failed attempt's result; a ``rejected`` one is recorded as failed.

        Correlation ids are kept on a best-effort basis: the failure is reported either way.

        Args:
            outcome: ``rejected``, ``transient`` or ``unknown``.
            reason: Why, in words an operator can act on; never a secret or a body.
            evidence: More evidence for this attempt only, not recorded. Default: none.
            **ids: Provider correlation ids, recorded with the operation.
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
        return ToolAttemptResult(
            outcome=outcome, reason=reason, evidence={**self.evidence, **(evidence or {})}
        )

    async def commit_local_effect(
        self,
        write: LocalWrite,
        resource_id: str,
        result: dict[str, Any] | None = None,
        *,
        lease: Lease | None = None,
        evidence: Mapping[str, str] | None = None,
        **ids: str,
    ) -> ToolAttemptResult:
        """Make an effect in onceflow's own database and record the success, in one
        transaction: both commit or neither does (use with
        ``DedupeStrategy.LOCAL_TRANSACTION``).

        The success is claimed first, so of two attempts racing, the second waits for the
        first to commit, writes nothing and returns its ``earlier_success``. A database
        failure is classified (``classify_database_error``): the transaction rolled back,
        so a repeat is safe, but a connection lost during the commit is ``unknown``. Call
        ``begin`` first. Example::

            async def insert_order(conn: AsyncConnection) -> None:
                await conn.execute("INSERT INTO orders ...", {...})

            return await operation.commit_local_effect(insert_order, order_id, body)

        Args:
            write: Writes the effect with the connection it is given (its transaction).
            resource_id: The resource the effect produces, recorded with the success.
            result: The documented result body, recorded for later attempts.
            lease: With a ``fenced_lease``: commit only while it still holds the
                operation (``LeaseLost`` otherwise, and nothing commits). Default: none.
            evidence: More evidence for this attempt only, not recorded. Default: none.
            **ids: Correlation ids, recorded with the operation.

        Raises:
            LeaseLost: ``lease`` was taken over; nothing was committed.
        """
        call = self._bound_call()
        body = dict(result or {})
        recorded = {**self.correlation, **_strings(ids)}
        params = {
            **call.operation_params(self),
            "resource_id": resource_id,
            "result": Jsonb(body),
            "ids": Jsonb(recorded),
        }
        try:
            async with call.pool.connection() as conn, conn.transaction():
                if lease is not None:
                    await check_fence(conn, self.key, lease)
                claimed = await (await conn.execute(_CLAIM_SUCCESS, params)).fetchone()
                if claimed is None:
                    earlier = await (await conn.execute(READ_OPERATION, params)).fetchone()
                else:
                    earlier = None
                    await write(conn)
        except (psycopg.Error, PoolTimeout) as error:
            outcome, reason = classify_database_error(error)
            failed = await self.failed(outcome, reason, evidence=evidence)
            # The record claims the success in the same transaction, so a repeat after
            # a lost connection is deduplicated: wait for the database, free of caps.
            return failed.model_copy(update={"database_unavailable": is_unreachable(error)})
        if claimed is None:
            if earlier is not None:
                self._load_row(earlier)
            success = self.earlier_success
            if success is None:  # the record vanished between the two statements
                return await self.failed(
                    OutcomeClass.TRANSIENT, "the operation record vanished; nothing was written"
                )
            return success
        self.correlation = recorded
        return self._success(resource_id, body, evidence)

    @asynccontextmanager
    async def fenced_transaction(self, lease: Lease) -> AsyncIterator[AsyncConnection[Any]]:
        """A transaction on onceflow's database that commits only while ``lease`` holds
        this operation: local writes fenced as the far side fences remote ones.

        The record stays locked until the block ends, so a take-over waits for a write in
        flight rather than slipping in before its commit. Example::

            async with operation.fenced_lease() as lease:
                ...
                async with operation.fenced_transaction(lease) as conn:
                    await conn.execute("UPDATE progress SET ...", {...})

        Raises:
            LeaseLost: A newer token holds the operation; nothing in the block commits
                (``lease.lost`` is set, and the lease is not released).
        """
        call = self._bound_call()
        async with call.pool.connection() as conn, conn.transaction():
            await check_fence(conn, self.key, lease)
            yield conn

    def fenced_lease(
        self, ttl: timedelta = DEFAULT_LEASE_TTL
    ) -> AbstractAsyncContextManager[Lease]:
        """Hold this operation alone for the block (use with ``DedupeStrategy.FENCED_LEASE``).

        Send ``lease.token`` with every write to the far side, which must refuse a token
        lower than the highest it has seen; write to onceflow's own database through
        ``fenced_transaction`` or ``commit_local_effect(..., lease=lease)``. The lease is
        extended (and the attempt heartbeats ``lease.progress``) every third of the
        shorter of ``ttl`` and the contract's ``heartbeat_timeout``; if another attempt
        took it over after it lapsed, the block is cancelled and ``LeaseLost`` raised (the
        attempt ends ``unknown``). While another attempt holds a live lease this waits up
        to two TTLs, then raises ``NothingSent`` (``transient``). Call ``begin`` first.

        Args:
            ttl: How long the lease outlives a silent holder. Default ``DEFAULT_LEASE_TTL``.
        """
        call = self._bound_call()
        heartbeat = call.contract.heartbeat_timeout
        return hold_lease(
            call.pool,
            self.key,
            ttl=ttl,
            owner=lease_owner(call.step_id, call.attempt),
            keep_every=min(ttl, heartbeat) / 3 if heartbeat else ttl / 3,
        )

    def _success(
        self, resource_id: str, body: dict[str, Any], evidence: Mapping[str, str] | None
    ) -> ToolAttemptResult:
        self.state, self.resource_id, self.result = "succeeded", resource_id, body
        return ToolAttemptResult(
            outcome=OutcomeClass.SUCCEEDED,
            resource_id=resource_id,
            result=body,
            evidence={**self.evidence, **(evidence or {})},
        )

    def _load_row(self, row: Any) -> None:
        state, resource_id, result, correlation = row
        self.state, self.resource_id = state, resource_id
        self.result, self.correlation = dict(result), _strings(correlation)

    def _bound_call(self) -> "ToolCall[Any]":
        if self._call is None:
            raise RuntimeError(
                "this child operation is not bound to this call (an operation of another "
                "step is read-only)"
            )
        return self._call

    async def _pool_execute(self, statement: str, **params: Any) -> None:
        call = self._bound_call()
        async with call.pool.connection() as conn:
            await conn.execute(statement, {**call.operation_params(self), **params})


def is_unreachable(error: BaseException) -> bool:
    """Whether a database failure means the server could not be reached (or the
    connection was lost), rather than a refused statement."""
    return isinstance(error, PoolTimeout | psycopg.OperationalError)


def generation_of(correlation: Mapping[str, Any]) -> int:
    recorded = str(correlation.get(KEY_GENERATION, "1"))
    return int(recorded) if recorded.isdigit() and int(recorded) >= 1 else 1


def _strings(ids: dict[str, Any]) -> dict[str, str]:
    return {name: str(value) for name, value in ids.items() if value is not None}
