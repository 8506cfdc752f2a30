"""The audit capability of the tool API: a tool family may compare what its provider holds
with onceflow's ``operations`` records over a time window, and report what disagrees.

A family offers it as an ``Auditor``; ``onceflow audit --family NAME`` runs it and prints
its ``AuditReport``. A report's findings are of three kinds::

    duplicate   one operation (one step's child operation, any key generation) has more
                than one effect at the provider
    orphan      an effect whose operation no step owns, or whose step did not succeed
                (an abandoned or failed step whose charge exists anyway)
    missing     a step recorded as succeeded whose resource the provider does not have

``read_operations`` and ``read_step_operations`` read the records an auditor compares
(digests of the child keys only, never a key itself); the comparison is the family's.
"""

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

from psycopg_pool import AsyncConnectionPool

from onceflow.errors import OnceflowError
from onceflow.tools._child_operation import generation_of
from onceflow.tools._identity import key_digest

_IN_WINDOW = """
SELECT child_key, tenant, workflow_id, step_id, tool, child_op, state, resource_id,
       correlation, created_at, updated_at
FROM operations
WHERE tool = ANY(%(tools)s) AND created_at >= %(since)s AND created_at < %(until)s
ORDER BY created_at
"""
_OF_STEPS = """
SELECT child_key, tenant, workflow_id, step_id, tool, child_op, state, resource_id,
       correlation, created_at, updated_at
FROM operations
WHERE tool = ANY(%(tools)s)
    AND (tenant, workflow_id, step_id) IN (
        SELECT * FROM unnest(%(tenants)s::text[], %(workflows)s::text[], %(steps)s::text[]))
"""


class FindingKind(StrEnum):
    """What an audit finding says is wrong."""

    DUPLICATE = "duplicate"
    """One operation has more than one effect at the provider."""
    ORPHAN = "orphan"
    """An effect whose operation no step owns, or whose step did not succeed."""
    MISSING = "missing"
    """A succeeded step whose resource the provider does not have."""


@dataclass(frozen=True, kw_only=True)
class AuditWindow:
    """The time window an audit reads: ``since`` <= created < ``until``."""

    since: datetime
    """Start of the window (inclusive), timezone-aware."""
    until: datetime
    """End of the window (exclusive), timezone-aware."""
    in_flight_grace: timedelta = timedelta(minutes=15)
    """A step still ``started`` whose record changed less than this long before the audit
    may be in flight (its effect made, its success not yet recorded): its effect is not
    an orphan yet. Default 15 minutes."""

    def __post_init__(self) -> None:
        if self.since.tzinfo is None or self.until.tzinfo is None:
            raise ValueError("an audit window's bounds must be timezone-aware")
        if self.since >= self.until:
            raise ValueError("an audit window must end after it starts")


@dataclass(frozen=True, kw_only=True)
class OperationRecord:
    """One row of onceflow's ``operations`` table, as an audit compares it."""

    operation_id: str
    """The child key's digest (``key_digest``): what the effect's metadata names."""
    tenant: str
    workflow_id: str
    step_id: str
    tool: str
    child_op: str
    state: str
    """``started``, ``succeeded`` or ``failed``."""
    resource_id: str | None
    """The resource the step recorded as its effect, when it succeeded."""
    generation: int
    """The key generation of this record's child key."""
    created_at: datetime
    updated_at: datetime

    @property
    def step(self) -> tuple[str, str, str, str]:
        """The operation this record belongs to, across key generations:
        ``(tenant, workflow_id, step_id, child_op)``."""
        return (self.tenant, self.workflow_id, self.step_id, self.child_op)


@dataclass(frozen=True, kw_only=True)
class AuditFinding:
    """One disagreement between the provider and onceflow's records."""

    kind: FindingKind
    tool: str
    """The tool whose operation (or whose kind of effect) it concerns."""
    detail: str
    """What was found, in one line an operator can act on."""
    resource_ids: tuple[str, ...]
    """The provider's resources involved (the recorded one first, for a duplicate)."""
    operation_id: str | None = None
    """The child key digest the effect or the record carries."""
    tenant: str | None = None
    workflow_id: str | None = None
    step_id: str | None = None
    step_state: str | None = None
    """The step's recorded state (``started``/``succeeded``/``failed``), None when no
    step owns the operation."""

    def to_json(self) -> dict[str, Any]:
        """The finding as a JSON object (``onceflow audit --json``)."""
        return {
            "kind": self.kind.value,
            "tool": self.tool,
            "detail": self.detail,
            "resource_ids": list(self.resource_ids),
            "operation_id": self.operation_id,
            "tenant": self.tenant,
            "workflow_id": self.workflow_id,
            "step_id": self.step_id,
            "step_state": self.step_state,
        }


@dataclass(frozen=True, kw_only=True)
class EffectTotal:
    """The effects of one kind in one currency found in the window."""

    kind: str
    """e.g. ``charge`` or ``refund``."""
    currency: str
    count: int
    amount: int
    """In the currency's smallest unit."""

    def to_json(self) -> dict[str, Any]:
        """The total as a JSON object."""
        return {
            "kind": self.kind,
            "currency": self.currency,
            "count": self.count,
            "amount": self.amount,
        }


@dataclass(frozen=True, kw_only=True)
class AuditReport:
    """What an audit found in one window; ``clean`` when there are no findings."""

    family: str
    window: AuditWindow
    findings: tuple[AuditFinding, ...]
    totals: tuple[EffectTotal, ...]
    """onceflow's effects in the window (those the provider lists with onceflow's
    metadata), by kind and currency."""
    operations_read: int
    """Records of the family's tools created in the window."""
    effects_read: int
    """Provider objects listed in the window (onceflow's or not, money moved or not)."""
    in_flight: int = 0
    """Effects of steps still ``started`` within ``in_flight_grace``: not judged yet."""

    @property
    def counts(self) -> dict[str, int]:
        """How many findings of each kind (every kind named, zero included)."""
        counts = {kind.value: 0 for kind in FindingKind}
        for finding in self.findings:
            counts[finding.kind.value] += 1
        return counts

    @property
    def clean(self) -> bool:
        """No finding of any kind."""
        return not self.findings

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON object (``onceflow audit --json``)."""
        return {
            "family": self.family,
            "since": self.window.since.isoformat(),
            "until": self.window.until.isoformat(),
            "clean": self.clean,
            "counts": self.counts,
            "findings": [finding.to_json() for finding in self.findings],
            "totals": [total.to_json() for total in self.totals],
            "operations_read": self.operations_read,
            "effects_read": self.effects_read,
            "in_flight": self.in_flight,
        }


class ProviderUnreadable(OnceflowError):
    """A read an audit needs failed at the provider: nothing can be concluded from the
    window. ``fix`` is what to do about it (shown with the reason)."""

    status = 502
    code = "provider-unreadable"
    title = "Provider unreadable"

    def __init__(
        self,
        reason: str,
        *,
        fix: str,
        credentials_refused: bool = False,
        transient: bool = False,
    ) -> None:
        super().__init__(reason)
        self.fix = fix
        self.credentials_refused = credentials_refused
        """The provider refused the credentials (a new key fixes it, no retry)."""
        self.transient = transient
        """Unreachable or overloaded: running the audit again may succeed."""


AuditProgress = Callable[[str, float], None]
"""Called as an audit advances: what it reads now and the fraction of the window read
(0.0 to 1.0), for a progress bar."""


class Auditor(Protocol):
    """A tool family's audit against its provider (the payments' is ``PaymentsAuditor``)."""

    @property
    def family(self) -> str:
        """The tool family audited, e.g. ``payments``."""
        ...

    async def audit(
        self, window: AuditWindow, *, progress: AuditProgress | None = None
    ) -> AuditReport:
        """Read the provider's effects and onceflow's records in ``window`` and compare
        them; reads only what is strongly consistent (a provider's list API, never an
        eventually consistent search)."""
        ...


async def read_operations(
    pool: AsyncConnectionPool, *, tools: Collection[str], since: datetime, until: datetime
) -> list[OperationRecord]:
    """The records of ``tools``' child operations created in ``[since, until)``, oldest
    first."""
    async with pool.connection() as conn:
        cursor = await conn.execute(
            _IN_WINDOW, {"tools": list(tools), "since": since, "until": until}
        )
        return [_record(row) for row in await cursor.fetchall()]


async def read_step_operations(
    pool: AsyncConnectionPool,
    *,
    tools: Collection[str],
    steps: Iterable[tuple[str, str, str]],
) -> list[OperationRecord]:
    """Every record of ``tools``' child operations of the given
    ``(tenant, workflow_id, step_id)`` steps, whenever they were created."""
    wanted = sorted(set(steps))
    if not wanted:
        return []
    tenants, workflows, step_ids = (list(column) for column in zip(*wanted, strict=True))
    async with pool.connection() as conn:
        cursor = await conn.execute(
            _OF_STEPS,
            {"tools": list(tools), "tenants": tenants, "workflows": workflows, "steps": step_ids},
        )
        return [_record(row) for row in await cursor.fetchall()]


def _record(row: Any) -> OperationRecord:
    (child_key, tenant, workflow_id, step_id, tool, child_op, state, resource_id) = row[:8]
    correlation, created_at, updated_at = row[8:]
    return OperationRecord(
        operation_id=key_digest(child_key),
        tenant=tenant,
        workflow_id=workflow_id,
        step_id=step_id,
        tool=tool,
        child_op=child_op,
        state=state,
        resource_id=resource_id,
        generation=generation_of(correlation),
        created_at=created_at,
        updated_at=updated_at,
    )
