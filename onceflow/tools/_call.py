"""What a tool's implementation gets for one attempt (``ToolCall``): its arguments, its
identity, its client, child operations with derived keys and persisted correlation ids
(``_child_operation``), heartbeats.

For a provider that forgets keys (``DedupeStrategy.PROVIDER_IDEMPOTENCY_KEY`` with a key
retention) ``begin`` is also where the key leaves: it records the key's first send
(``key_first_sent_at``, the database's clock, once) and refuses with ``KeyWindowClosed``,
sending nothing, once the send-by deadline (first send + retention - margin, from the
task's pinned policy) has passed.
"""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel
from temporalio import activity

from onceflow.tools._attempts import ToolCallInput
from onceflow.tools._child_operation import (
    DEFAULT_HEARTBEAT_EVERY,
    KEY_GENERATION,
    MARK_FIRST_SEND,
    READ_CLOCK,
    READ_GENERATIONS,
    READ_OPERATION,
    STALE_ATTEMPT_MARGIN,
    START_OPERATION,
    ChildOperation,
    generation_of,
    is_unreachable,
)
from onceflow.tools._classify import DatabaseUnavailable, KeyWindowClosed, NothingSent
from onceflow.tools._contract import ToolContract
from onceflow.tools._identity import derive_child_key
from onceflow.tools._policy import ToolPolicy

ArgsT = TypeVar("ArgsT", bound=BaseModel)


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
    def policy(self) -> ToolPolicy:
        """The tool's policy as the task carries it (the send-by window comes from here)."""
        return self.identity.policy

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

    @property
    def claimed_resource_id(self) -> str | None:
        """In a look-up checking an operator's ``happened``: the resource id the operator
        named, to verify (it exists, it belongs to this step) before anything else; None
        in every other look-up and attempt."""
        return self.identity.claimed_resource_id

    @property
    def accept_unverified(self) -> bool:
        """With ``claimed_resource_id``: the operator accepted that resource unverified.
        Record it as the step's effect (``operation.succeeded``) even when the checks
        fail, so steps that read the record (a refund by ``charge_step``) find it."""
        return self.identity.accept_unverified

    @property
    def attempt_timeout(self) -> timedelta:
        """How long this attempt may run in all: the limit Temporal enforces on it, else
        the contract's ``start_to_close_timeout``. Work that waits (polls a far side for
        an outcome) should give up a little before it, to report what it saw."""
        limit = activity.info().start_to_close_timeout if activity.in_activity() else None
        return limit or self.contract.attempt_timeout

    def child_key(self, child_op: str, *, provider_account: str, step_id: str | None = None) -> str:
        """The derived idempotency key of one child operation at one provider account,
        in this step's current key generation.

        Args:
            child_op: Which child effect of the step.
            provider_account: The provider account the effect lands in.
            step_id: Another step of the same task (its first generation's key; ``find``
                reads every generation). Default: this step.
        """
        own = step_id is None or step_id == self.step_id
        return self._generation_key(
            child_op,
            provider_account,
            self.step_id if step_id is None else step_id,
            self.identity.key_generation if own else 1,
        )

    def _generation_key(
        self, child_op: str, provider_account: str, step_id: str, generation: int
    ) -> str:
        return derive_child_key(
            tenant=self.tenant,
            workflow_id=self.workflow_id,
            step_id=step_id,
            child_op=child_op,
            provider_account=provider_account,
            generation=generation,
        )

    async def begin(self, child_op: str, *, provider_account: str) -> ChildOperation:
        """Start (or resume) a child operation: record it before anything is sent. Call it
        right before sending: for a provider that forgets keys this is the key's send.

        Returns the operation with what earlier attempts recorded; if one succeeded (in
        this key generation or an earlier one), return ``operation.earlier_success``
        instead of sending again.

        Raises:
            KeyWindowClosed: The provider forgets keys and this key's send-by deadline
                (its first send + retention - margin, the task's pinned policy) has
                passed; nothing was sent, and the workflow looks the effect up, then
                parks. A tool need not catch it.
            NothingSent: The record could not be read or written, or Temporal gives this
                attempt up within ``STALE_ATTEMPT_MARGIN`` (a paused or backlogged worker
                woke after its timeout): nothing was sent, the attempt ends ``transient``.
        """
        return await self._load(child_op, provider_account, start=True)

    async def find(
        self, child_op: str, *, provider_account: str, step_id: str | None = None
    ) -> ChildOperation:
        """A child operation's record without starting it: for ``look_up`` functions, and
        to read what an earlier step of the same task recorded (a refund reads the
        PaymentIntent its charge step made). Every key generation is read: the one that
        succeeded is returned if any, else the latest.

        Args:
            child_op: Which child effect of the step.
            provider_account: The provider account the effect lands in.
            step_id: Another step of the same task, whose operation is then read-only.
                Default: this step.

        Raises:
            NothingSent: The record could not be read; nothing was sent.
        """
        if step_id is None or step_id == self.step_id:
            return await self._load(child_op, provider_account, start=False)
        return await self._load(child_op, provider_account, start=False, step_id=step_id)

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

    async def _load(
        self, child_op: str, provider_account: str, *, start: bool, step_id: str | None = None
    ) -> ChildOperation:
        own = step_id is None
        step = self.step_id if step_id is None else step_id
        generation = self.identity.key_generation if own else 1
        operation = self._operation(child_op, provider_account, step, generation, bound=own)
        params = {**self.operation_params(operation), "step_id": step}
        sends = start and self.policy.forgets_keys
        now: datetime | None = None
        try:
            async with self.pool.connection() as conn:
                if not own or generation > 1:
                    # Another step's generation is unknown here; this step's earlier
                    # generations may hold its success.
                    rows = await (await conn.execute(READ_GENERATIONS, params)).fetchall()
                    found = self._pick_generation(
                        rows, child_op, provider_account, step, up_to=generation if own else None
                    )
                    if found is not None and (not own or found.state == "succeeded"):
                        found._call = operation._call
                        return found
                    if not own:
                        return operation
                if start:
                    clock = await (await conn.execute(READ_CLOCK)).fetchone()
                    now = clock[0] if clock else None
                    if now is not None:
                        self._refuse_given_up_attempt(child_op, now)
                    await conn.execute(
                        START_OPERATION, {**params, "ids": Jsonb(operation.correlation)}
                    )
                if sends:
                    await conn.execute(MARK_FIRST_SEND, params)
                row = await (await conn.execute(READ_OPERATION, params)).fetchone()
        except NothingSent:
            raise
        except Exception as error:
            what = "record" if start else "read"
            failure = DatabaseUnavailable if is_unreachable(error) else NothingSent
            raise failure(
                f"could not {what} {child_op!r} before sending ({type(error).__name__})"
            ) from error
        if row is not None:
            operation._load_row(row)
        if sends and now is not None and operation.state != "succeeded":
            self._refuse_past_send_by(operation, now)
        return operation

    def _refuse_given_up_attempt(self, child_op: str, now: datetime) -> None:
        """Send nothing from an attempt Temporal has given up on (or nearly): a worker
        that was paused or backlogged past the attempt's timeout still runs it when it
        wakes, while the workflow may already have looked the effect up, parked it, or
        moved the step to a new key generation. Checked where the key leaves."""
        if not activity.in_activity():
            return
        info = activity.info()
        limits = [t for t in (info.start_to_close_timeout, info.heartbeat_timeout) if t]
        if not limits:
            return
        limit = min(limits)
        given_up_at = info.started_time + limit
        # Leave the send time to arrive before Temporal gives the attempt up.
        if now < given_up_at - min(limit / 4, STALE_ATTEMPT_MARGIN):
            return
        raise NothingSent(
            f"not sent: this attempt started at {info.started_time.isoformat(timespec='seconds')}"
            f" and Temporal gives it up at {given_up_at.isoformat(timespec='seconds')} (its "
            f"timeout {limit}); the worker was paused or backlogged, and a {child_op!r} sent "
            "now could race the workflow's next decision"
        )

    def _operation(
        self, child_op: str, provider_account: str, step_id: str, generation: int, *, bound: bool
    ) -> ChildOperation:
        keys = tuple(
            self._generation_key(child_op, provider_account, step_id, number)
            for number in range(1, generation + 1)
        )
        return ChildOperation(
            key=keys[-1],
            child_op=child_op,
            state=None,
            correlation={KEY_GENERATION: str(generation)} if generation > 1 else {},
            generation=generation,
            generation_keys=keys,
            # Another step's operation is read-only: its record's identity is not ours.
            _call=self if bound else None,
        )

    def _pick_generation(
        self,
        rows: list[Any],
        child_op: str,
        provider_account: str,
        step_id: str,
        *,
        up_to: int | None,
    ) -> ChildOperation | None:
        """The record that succeeded (the latest generation if several did), else the
        latest generation's, among the rows whose key derives from this provider account."""
        generations: dict[int, Any] = {}
        for child_key, *row in rows:
            number = generation_of(row[3])
            if up_to is not None and number > up_to:
                continue
            if child_key == self._generation_key(child_op, provider_account, step_id, number):
                generations[number] = row
        if not generations:
            return None
        succeeded = [number for number, row in generations.items() if row[0] == "succeeded"]
        number = max(succeeded or generations)
        operation = self._operation(child_op, provider_account, step_id, number, bound=False)
        operation._load_row(generations[number])
        return operation

    def _refuse_past_send_by(self, operation: ChildOperation, now: datetime) -> None:
        first = operation.first_sent_at
        send_by = self.policy.send_by(first) if first else None
        if first is None or send_by is None or now < send_by:
            return
        raise KeyWindowClosed(
            f"not sent: the send-by deadline of the step's {operation.child_op!r} key "
            f"({send_by.isoformat(timespec='seconds')}: first sent "
            f"{first.isoformat(timespec='seconds')} + retention {self.policy.key_retention} "
            f"- margin {self.policy.retention_margin}) has passed, so the provider may have "
            "forgotten the key and a repeat could make a second effect",
            {**operation.evidence, "key_send_by": send_by.isoformat()},
        )
