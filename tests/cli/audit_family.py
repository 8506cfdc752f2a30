"""A user's tool family that offers an audit, loaded with ``ONCEFLOW_TOOLS`` like any
custom family: ``onceflow audit --family ledger`` must open it exactly as it opens the
payments' audit. Its provider is this module's ``LEDGER``: effects no step owns."""

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from psycopg_pool import AsyncConnectionPool

from onceflow.tools import (
    AuditFinding,
    AuditProgress,
    AuditReport,
    AuditWindow,
    FindingKind,
    ToolFamily,
)


class LedgerAuditor:
    """Reports every effect of the ledger as an orphan (no step of the family owns any)."""

    def __init__(self, pool: AsyncConnectionPool, effects: tuple[str, ...]) -> None:
        self._pool = pool
        self._effects = effects

    @property
    def family(self) -> str:
        return "ledger"

    async def audit(
        self, window: AuditWindow, *, progress: AuditProgress | None = None
    ) -> AuditReport:
        async with self._pool.connection() as conn:  # the database it was opened with
            await conn.execute("SELECT 1")
        return AuditReport(
            family=self.family,
            window=window,
            findings=tuple(
                AuditFinding(
                    kind=FindingKind.ORPHAN,
                    tool="ledger_post",
                    detail=f"{effect} is in the ledger and no step owns it",
                    resource_ids=(effect,),
                )
                for effect in self._effects
            ),
            totals=(),
            operations_read=0,
            effects_read=len(self._effects),
        )


@asynccontextmanager
async def _open_auditor(pool: AsyncConnectionPool) -> AsyncIterator[LedgerAuditor]:
    effects = tuple(e for e in os.environ.get("LEDGER_EFFECTS", "").split(",") if e)
    yield LedgerAuditor(pool, effects)


def ledger_family() -> ToolFamily:
    """No tools to serve here: only the audit."""
    return ToolFamily(name="ledger", tools=(), open_auditor=_open_auditor)
