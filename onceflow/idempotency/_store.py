"""Idempotency records in PostgreSQL: atomic claim, lease takeover, fenced completion, pruning
(who writes a task's outcome, and why: the package's docstring).

State machine of one record, keyed by ``(scope, idempotency_key)``::

    (none) ──claim──▶ processing[lease] ──start task──▶ processing[started] ──outcome──▶ succeeded
                          │    ▲                                                    └──▶ failed
                          │    └── take over after the lease expires (fencing_token + 1)
                          └── release (only when nothing was started: a retry after pruning
                              whose key now names a different request)

    succeeded | failed ──result_expires_at passed──▶ pruned (a later retry is a new operation;
                                                       gateways hear of it: PRUNED_RECORDS_CHANNEL)

A plan task's starter marks it started only once it ran for ``MARK_STARTED_AFTER``; one
that ends sooner goes from processing[lease] to its outcome in one write, which marks it
too. A claim whose owner died before marking it keeps its lease: a retry takes it over
after the lease and joins the task (its workflow id is derived from the key), and the
upkeep pass writes the outcome of an ended task started for the claim's request
(``started_unrecorded``).

A keyed decision (approve or reconcile of an existing task) starts nothing: its owner
sends the decision and completes the record (``complete``) with the task's answer, a
refusal included, or releases it (``release``) when no answer came. Its ``workflow_id``
is derived from its scope and key like a task's but names no workflow (none is ever
started under it, so no task's outcome lands there); its ``resource_id`` is the task it
decided::

    (none) ──claim──▶ processing[lease] ──complete──▶ succeeded (200) | failed (409)
                          │    ▲
                          │    └── take over after the lease expires (a resend is safe: the
                          │        task keeps one decision per step)
                          └── release (no answer from the task, e.g. 503)

A keyed call of an open task starts nothing either: its owner sends the call and
completes the record with the task's first answer (or its refusal), or releases it when
the task service could not be reached. An answer that is not final (the call is parked,
awaits approval or still runs) is refreshed by later requests with the same key, which
ask the task again; the first final answer replaces it (``refresh``), compared and set
on the stored body so two refreshes never overwrite a final answer::

    (none) ──claim──▶ processing[lease] ──complete──▶ succeeded (200 ended | 202 not yet)
                                                          │ refresh (202 → 200, once)
                                                          ▼
                                                      succeeded (200)

A new key counts against its principal's quota of new keys per window by the slot its
record takes in the window (``claim_idempotency_key``, migration 17): a unique index lets
one record hold each of the quota's slots, so the database admits exactly the quota and
the claim writes its record and nothing else; concurrent claims of one principal start
from the slots their keys hash to. A replay never counts, an over-quota claim writes
nothing. A released claim frees its slot (it started nothing); a pruned record's window
has always passed (a record is kept until it has).

Every time comparison uses the database clock, so gateways with skewed clocks agree on
who owns a lease. Every write after the claim names the fencing token (or the task's
run) it expects, so a slow former owner can no longer change the record.
"""

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

from psycopg import errors
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from onceflow.errors import QuotaExceeded
from onceflow.storage import autocommit

T = TypeVar("T")

_SERIALIZATION_RETRIES = 5


class RecordState(StrEnum):
    """Where one idempotency record is."""

    PROCESSING = "processing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True, kw_only=True)
class IdempotencyRecord:
    """One claimed key, as read from the database at ``read_at`` (database clock)."""

    scope: str
    idempotency_key: str = field(repr=False)
    """The client's raw key: never logged, never part of a repr."""
    request_hash: str
    state: RecordState
    owner_token: str | None
    fencing_token: int
    lease_expires_at: datetime | None
    tenant: str
    principal_id: uuid.UUID
    workflow_id: str
    workflow_run_id: str | None
    workflow_started_at: datetime | None
    status_code: int | None
    resource_id: str | None
    response_body: Any = field(repr=False)
    result_expires_at: datetime
    created_at: datetime
    read_at: datetime

    @property
    def is_terminal(self) -> bool:
        """Whether the task's result is stored and can be replayed."""
        return self.state is not RecordState.PROCESSING

    @property
    def task_started(self) -> bool:
        """Whether the claim's owner reported the task workflow started."""
        return self.workflow_started_at is not None

    @property
    def lease_expired(self) -> bool:
        """Whether another request may take an unstarted claim over (database clock)."""
        return self.lease_expires_at is not None and self.lease_expires_at <= self.read_at

    @property
    def lease_left(self) -> timedelta:
        """Time until the claim's lease expires (zero when it has)."""
        if self.lease_expires_at is None:
            return timedelta(0)
        return max(self.lease_expires_at - self.read_at, timedelta(0))


@dataclass(frozen=True, kw_only=True)
class NewClaim:
    """What a request asks to reserve."""

    scope: str
    idempotency_key: str = field(repr=False)
    request_hash: str
    tenant: str
    principal_id: uuid.UUID
    workflow_id: str
    lease: timedelta
    result_retention: timedelta
    key_quota: int
    quota_window_seconds: int

    def parameters(self) -> dict[str, Any]:
        """The claim's statement parameters (``claim_idempotency_key``'s), with a new
        owner token."""
        return {
            "scope": self.scope,
            "idempotency_key": self.idempotency_key,
            "request_hash": self.request_hash,
            "owner_token": uuid.uuid4().hex,
            "lease": self.lease,
            "tenant": self.tenant,
            "principal_id": self.principal_id,
            "workflow_id": self.workflow_id,
            "result_retention": self.result_retention,
            "quota": self.key_quota,
            "window": self.quota_window_seconds,
        }


@dataclass(frozen=True)
class Claimed:
    """This request now owns the key: it must start the task."""

    record: IdempotencyRecord


@dataclass(frozen=True)
class AlreadyClaimed:
    """The key was claimed before: compare fingerprints, replay or wait."""

    record: IdempotencyRecord


@dataclass(frozen=True)
class Unrecorded:
    """A record the upkeep pass may write its task's outcome into."""

    workflow_id: str
    request_hash: str
    marked: bool
    """Marked started by its owner. An unmarked one takes an ended task's outcome only if
    the task was started for its request (the fingerprint in the task's memo)."""


@dataclass(frozen=True)
class PruneResult:
    """What one prune pass deleted."""

    records: int
    usage_windows: int


_COLUMNS = """
    scope, idempotency_key, request_hash, state, owner_token, fencing_token,
    lease_expires_at, tenant, principal_id, workflow_id, workflow_run_id,
    workflow_started_at, status_code, resource_id, response_body, result_expires_at,
    created_at, statement_timestamp() AS read_at
"""

# One statement, run as its own transaction (autocommit): ``claim_idempotency_key``
# (migration 17) inserts the record in a free quota slot of the principal's window; or
# returns the record that holds the key, so a replay reads it in the same round trip and
# never counts. With no slot free it raises ``_QUOTA_SPENT`` and has written nothing.
_CLAIM = """
SELECT * FROM claim_idempotency_key(
    %(scope)s, %(idempotency_key)s, %(request_hash)s, %(owner_token)s, %(lease)s,
    %(tenant)s, %(principal_id)s, %(workflow_id)s, %(result_retention)s, %(quota)s,
    %(window)s
)
"""

_QUOTA_SPENT = "OF429"
"""The SQLSTATE ``claim_idempotency_key`` raises over quota; its detail is the number of
seconds left in the window."""

_GET = f"""
SELECT {_COLUMNS} FROM idempotency_records
WHERE scope = %(scope)s AND idempotency_key = %(idempotency_key)s
"""

_TAKE_OVER = f"""
UPDATE idempotency_records
SET owner_token = %(owner_token)s, fencing_token = fencing_token + 1,
    lease_expires_at = statement_timestamp() + %(lease)s, updated_at = statement_timestamp()
WHERE scope = %(scope)s AND idempotency_key = %(idempotency_key)s
  AND state = 'processing' AND workflow_started_at IS NULL
  AND fencing_token = %(fencing_token)s AND lease_expires_at <= statement_timestamp()
RETURNING {_COLUMNS}
"""

_MARK_STARTED = """
UPDATE idempotency_records
SET workflow_started_at = statement_timestamp(), workflow_run_id = %(run_id)s,
    updated_at = statement_timestamp()
WHERE scope = %(scope)s AND idempotency_key = %(idempotency_key)s
  AND state = 'processing' AND fencing_token = %(fencing_token)s
  AND owner_token = %(owner_token)s
"""

_RELEASE = """
DELETE FROM idempotency_records
WHERE scope = %(scope)s AND idempotency_key = %(idempotency_key)s
  AND state = 'processing' AND workflow_started_at IS NULL
  AND fencing_token = %(fencing_token)s AND owner_token = %(owner_token)s
"""

# A decision's answer, fenced like the claim's other writes: only the owner holding the
# current token completes it.
_COMPLETE = """
UPDATE idempotency_records
SET state = %(state)s, status_code = %(status_code)s, response_body = %(response_body)s,
    resource_id = %(resource_id)s, owner_token = NULL, lease_expires_at = NULL,
    result_expires_at = statement_timestamp() + result_retention,
    updated_at = statement_timestamp()
WHERE scope = %(scope)s AND idempotency_key = %(idempotency_key)s
  AND state = 'processing' AND workflow_started_at IS NULL
  AND fencing_token = %(fencing_token)s AND owner_token = %(owner_token)s
"""

# A stored call answer that was not final, replaced by a later one: only when the body is
# still the one the refresher read, so the first final answer stays.
_REFRESH = """
UPDATE idempotency_records
SET state = %(state)s, status_code = %(status_code)s, response_body = %(response_body)s,
    result_expires_at = statement_timestamp() + result_retention,
    updated_at = statement_timestamp()
WHERE scope = %(scope)s AND idempotency_key = %(idempotency_key)s
  AND state <> 'processing' AND request_hash = %(request_hash)s
  AND response_body = %(expected_body)s
"""

# Fenced by the task itself: only the record naming this workflow id, still processing,
# and not bound to another run of it (nor, when given, made for another request), takes
# the result.
_RECORD_OUTCOME = """
UPDATE idempotency_records
SET state = %(state)s, status_code = %(status_code)s, response_body = %(response_body)s,
    resource_id = %(resource_id)s, owner_token = NULL, lease_expires_at = NULL,
    workflow_run_id = coalesce(workflow_run_id, %(run_id)s),
    -- The task ran, so it started: its outcome may land before the starter marks it.
    workflow_started_at = coalesce(workflow_started_at, statement_timestamp()),
    result_expires_at = statement_timestamp() + result_retention,
    updated_at = statement_timestamp()
WHERE workflow_id = %(workflow_id)s AND state = 'processing'
  AND (workflow_run_id IS NULL OR %(run_id)s::text IS NULL OR workflow_run_id = %(run_id)s)
  AND (%(request_hash)s::text IS NULL OR request_hash = %(request_hash)s)
"""

# Tasks whose outcome no one has written yet: started ones, and claims left unmarked whose
# lease ran out (their owner died before it marked the task started, or before it started
# it). No index: one scan per upkeep pass (hourly) costs less than an index every claim or
# start would have to keep up.
_STARTED_UNRECORDED = """
SELECT workflow_id, request_hash, workflow_started_at IS NOT NULL FROM idempotency_records
WHERE state = 'processing'
  AND coalesce(workflow_started_at, lease_expires_at) <= statement_timestamp() - %(older_than)s
"""

PRUNED_RECORDS_CHANNEL = "onceflow_records_pruned"
"""What a prune pass that deleted records notifies, as it commits: a gateway forgets the
answers it remembers (``onceflow.gateway``'s answer cache), so none outlives its record."""

# The notification is sent with the deletion, in its transaction: delivered exactly when
# the records are gone.
_PRUNE_RECORDS = f"""
WITH pruned AS (
    DELETE FROM idempotency_records WHERE ctid IN (
        SELECT ctid FROM idempotency_records
        WHERE state <> 'processing' AND result_expires_at <= statement_timestamp()
          -- A record holds its key's quota slot until its window has passed: pruned
          -- sooner (a retention shorter than the window), it would let another key take
          -- the slot and the window admit more than the quota.
          AND (quota_window_ends_at IS NULL OR quota_window_ends_at <= statement_timestamp())
        LIMIT %(batch)s
    )
    RETURNING 1
), counted AS (SELECT count(*) AS deleted FROM pruned)
SELECT deleted, CASE WHEN deleted > 0 THEN pg_notify('{PRUNED_RECORDS_CHANNEL}', '') END
FROM counted
"""

# Old windows of both former quota tables, counted before migration 17 (in
# principal_key_usage by gateways older than migration 10); no claim writes them now. One
# window is one principal's window, however many shards it has.
_PRUNE_USAGE = """
WITH sharded AS (
    DELETE FROM principal_key_usage_shards
    WHERE window_start < statement_timestamp() - interval '1 day'
    RETURNING principal_id, window_start
), unsharded AS (
    DELETE FROM principal_key_usage
    WHERE window_start < statement_timestamp() - interval '1 day'
    RETURNING principal_id, window_start
)
SELECT count(*) FROM (SELECT * FROM sharded UNION SELECT * FROM unsharded) AS windows
"""


class IdempotencyStore:
    """The ``idempotency_records`` table behind every boundary transport.

    Every method runs single statements, each its own transaction (autocommit): one
    round trip each, where an implicit transaction would add a BEGIN and a COMMIT.
    """

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    @property
    def pool(self) -> AsyncConnectionPool:
        """The pool its statements run on (the boundary's other tables share it)."""
        return self._pool

    async def claim(self, new: NewClaim) -> Claimed | AlreadyClaimed:
        """Claim ``(scope, key)`` atomically, or return the record that holds it.

        Raises:
            QuotaExceeded: The key is new and the principal's window quota is spent;
                nothing was written.
        """
        params = new.parameters()
        # A claim that conflicts with a record pruned or released between the insert and
        # the read finds nothing; claiming again settles it.
        for _ in range(5):
            outcome = await _retry_serialization(lambda: self._insert_claim(params))
            if outcome is not None:
                return outcome
        raise RuntimeError("the idempotency record kept vanishing between claim and read")

    async def _insert_claim(self, params: dict[str, Any]) -> Claimed | AlreadyClaimed | None:
        async with self._pool.connection() as conn, autocommit(conn):
            cursor = conn.cursor(row_factory=dict_row)
            try:
                await cursor.execute(_CLAIM, params)
            except errors.DatabaseError as error:
                if error.sqlstate != _QUOTA_SPENT:
                    raise
                raise QuotaExceeded(
                    f"this principal may create at most {params['quota']} new idempotency "
                    f"keys per {params['window']} s",
                    retry_after_seconds=max(int(error.diag.message_detail or 1), 1),
                ) from None
            row = await cursor.fetchone()
        if row is None:
            return None
        record = _record(row)
        return Claimed(record) if row["claimed"] else AlreadyClaimed(record)

    async def get(self, scope: str, idempotency_key: str) -> IdempotencyRecord | None:
        """The record of ``(scope, key)``, read in its own statement."""
        async with self._pool.connection() as conn, autocommit(conn):
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(_GET, {"scope": scope, "idempotency_key": idempotency_key})
            row = await cursor.fetchone()
        return _record(row) if row is not None else None

    async def take_over(
        self, record: IdempotencyRecord, *, lease: timedelta
    ) -> IdempotencyRecord | None:
        """Become the owner of an unstarted claim whose lease expired; None if another did."""
        params = {
            "scope": record.scope,
            "idempotency_key": record.idempotency_key,
            "fencing_token": record.fencing_token,
            "owner_token": uuid.uuid4().hex,
            "lease": lease,
        }

        async def update() -> IdempotencyRecord | None:
            async with self._pool.connection() as conn, autocommit(conn):
                cursor = conn.cursor(row_factory=dict_row)
                await cursor.execute(_TAKE_OVER, params)
                row = await cursor.fetchone()
            return _record(row) if row is not None else None

        return await _retry_serialization(update)

    async def mark_started(self, record: IdempotencyRecord, *, run_id: str | None) -> bool:
        """Note that the task started; False when the claim was taken over meanwhile."""
        return await self._fenced(_MARK_STARTED, record, run_id=run_id)

    async def release(self, record: IdempotencyRecord) -> bool:
        """Delete an unstarted claim this request still owns (nothing was started)."""
        return await self._fenced(_RELEASE, record)

    async def complete(
        self,
        record: IdempotencyRecord,
        *,
        state: RecordState,
        status_code: int,
        response_body: Any,
        resource_id: str | None,
    ) -> bool:
        """Store the answer of a claim that started no task (a decision) as its result;
        False when the claim was taken over meanwhile (the new owner stores its own)."""
        if state is RecordState.PROCESSING:
            raise ValueError("an answer is terminal: succeeded or failed")
        return await self._fenced(
            _COMPLETE,
            record,
            state=state.value,
            status_code=status_code,
            response_body=Jsonb(response_body),
            resource_id=resource_id,
        )

    async def refresh(
        self,
        record: IdempotencyRecord,
        *,
        state: RecordState,
        status_code: int,
        response_body: Any,
    ) -> bool:
        """Replace the stored answer of a completed record with a newer one (a call that
        has ended since its first answer); False when the stored body is no longer the
        one ``record`` holds (another request refreshed it first). The result's expiry
        starts again: the answer became final now."""
        if state is RecordState.PROCESSING or not record.is_terminal:
            raise ValueError("only a completed record's answer can be refreshed")

        async def write() -> bool:
            async with self._pool.connection() as conn, autocommit(conn):
                cursor = await conn.execute(
                    _REFRESH,
                    {
                        "scope": record.scope,
                        "idempotency_key": record.idempotency_key,
                        "request_hash": record.request_hash,
                        "expected_body": Jsonb(record.response_body),
                        "state": state.value,
                        "status_code": status_code,
                        "response_body": Jsonb(response_body),
                    },
                )
                return cursor.rowcount == 1

        return await _retry_serialization(write)

    async def _fenced(self, sql: str, record: IdempotencyRecord, **extra: Any) -> bool:
        params = {
            "scope": record.scope,
            "idempotency_key": record.idempotency_key,
            "fencing_token": record.fencing_token,
            "owner_token": record.owner_token,
            **extra,
        }

        async def write() -> bool:
            async with self._pool.connection() as conn, autocommit(conn):
                cursor = await conn.execute(sql, params)
                return cursor.rowcount == 1

        return await _retry_serialization(write)

    async def record_outcome(
        self,
        *,
        workflow_id: str,
        run_id: str | None,
        state: RecordState,
        status_code: int,
        response_body: Any,
        resource_id: str | None,
        request_hash: str | None = None,
    ) -> bool:
        """Store a task's terminal result in its record; False if no processing record
        names this task (already recorded, released, bound to another run, or, with
        ``request_hash``, claimed for another request)."""
        if state is RecordState.PROCESSING:
            raise ValueError("an outcome is terminal: succeeded or failed")
        params = {
            "workflow_id": workflow_id,
            "run_id": run_id,
            "request_hash": request_hash,
            "state": state.value,
            "status_code": status_code,
            "response_body": Jsonb(response_body),
            "resource_id": resource_id,
        }

        async def write() -> bool:
            async with self._pool.connection() as conn, autocommit(conn):
                cursor = await conn.execute(_RECORD_OUTCOME, params)
                return cursor.rowcount == 1

        return await _retry_serialization(write)

    async def started_unrecorded(self, *, older_than: timedelta) -> list[Unrecorded]:
        """Records still waiting for their task's outcome ``older_than`` after the task
        was marked started, or after an unmarked claim's lease ran out (tasks running,
        parked or awaiting a person, ended ones their starter left, and claims whose owner
        died: a few thousand at most)."""
        async with self._pool.connection() as conn, autocommit(conn):
            cursor = await conn.execute(_STARTED_UNRECORDED, {"older_than": older_than})
            return [
                Unrecorded(workflow_id=row[0], request_hash=row[1], marked=row[2])
                for row in await cursor.fetchall()
            ]

    async def prune(self, *, batch: int = 1000) -> PruneResult:
        """Delete terminal records whose result retention has passed, and old quota windows.

        Processing records are never pruned, whatever their age: their task may still
        write its result, and forgetting them would let a retry run it again. Nor is a
        record whose quota window is still open (a result retention shorter than
        ``quota_window_seconds``): it holds its key's slot until the window ends.
        """
        deleted = 0
        while True:
            async with self._pool.connection() as conn, autocommit(conn):
                row = await (await conn.execute(_PRUNE_RECORDS, {"batch": batch})).fetchone()
            pruned = int(row[0]) if row is not None else 0
            deleted += pruned
            if pruned < batch:
                break
        async with self._pool.connection() as conn, autocommit(conn):
            usage = await (await conn.execute(_PRUNE_USAGE)).fetchone()
        return PruneResult(records=deleted, usage_windows=usage[0] if usage else 0)


async def _retry_serialization(operation: Callable[[], Awaitable[T]]) -> T:
    """Run a transaction again when PostgreSQL aborted it for a serialization conflict.

    Only whole transactions are repeated, and only on SQLSTATE 40001/40P01, which
    guarantee that the aborted attempt wrote nothing.
    """
    for attempt in range(1, _SERIALIZATION_RETRIES + 1):
        try:
            return await operation()
        except (errors.SerializationFailure, errors.DeadlockDetected):
            if attempt == _SERIALIZATION_RETRIES:
                raise
            await asyncio.sleep(0.005 * 2**attempt)
    raise AssertionError("unreachable")


def _record(row: dict[str, Any]) -> IdempotencyRecord:
    return IdempotencyRecord(
        scope=row["scope"],
        idempotency_key=row["idempotency_key"],
        request_hash=row["request_hash"],
        state=RecordState(row["state"]),
        owner_token=row["owner_token"],
        fencing_token=row["fencing_token"],
        lease_expires_at=row["lease_expires_at"],
        tenant=row["tenant"],
        principal_id=row["principal_id"],
        workflow_id=row["workflow_id"],
        workflow_run_id=row["workflow_run_id"],
        workflow_started_at=row["workflow_started_at"],
        status_code=row["status_code"],
        resource_id=row["resource_id"],
        response_body=row["response_body"],
        result_expires_at=row["result_expires_at"],
        created_at=row["created_at"],
        read_at=row["read_at"],
    )
