"""The providers' budgets in PostgreSQL, where every worker sees them: one row per provider
(``provider_budgets``), changed under the row's lock by the pure rules of ``_provider``,
and the audit of every pause and resume (``provider_pauses``).

A first attempt only reads the row (a paused or throttled provider holds it); a retry,
and an answer that changes the row, take the row's lock for one short transaction, so
concurrent workers never lose an update nor overdraw the bucket. Times are the
database's clock, the one clock all workers share.
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from onceflow.storage import autocommit
from onceflow.tools._provider import (
    Admission,
    Answer,
    BudgetRow,
    Pause,
    Provider,
    ProviderHealth,
    Send,
    admit,
    after_answer,
)

_log = logging.getLogger(__name__)

_COLUMNS = """tokens, failing_since, refilled_at, hold_until, paused_at, paused_by,
pause_reason, clock_timestamp() AS now"""
_READ = f"SELECT {_COLUMNS} FROM provider_budgets WHERE provider = %(provider)s"
_READ_ALL = f"SELECT provider, {_COLUMNS} FROM provider_budgets ORDER BY provider"
_LOCK = f"{_READ} FOR UPDATE"
_ENSURE = """
INSERT INTO provider_budgets (provider, tokens) VALUES (%(provider)s, %(tokens)s)
ON CONFLICT (provider) DO NOTHING
"""
_WRITE = """
UPDATE provider_budgets SET tokens = %(tokens)s, failing_since = %(failing_since)s,
    refilled_at = %(refilled_at)s, hold_until = %(hold_until)s, paused_at = %(paused_at)s,
    paused_by = %(paused_by)s, pause_reason = %(pause_reason)s, updated_at = now()
WHERE provider = %(provider)s
"""
_AUDIT = """
INSERT INTO provider_pauses (provider, action, operator, reason)
VALUES (%(provider)s, %(action)s, %(operator)s, %(reason)s)
"""
_HISTORY = """
SELECT action, operator, reason, at FROM provider_pauses WHERE provider = %(provider)s
ORDER BY id DESC LIMIT %(limit)s
"""


@dataclass(frozen=True, kw_only=True)
class Asked:
    """A send's admission, and the row as the send left it (for its answer)."""

    admission: Admission
    row: BudgetRow | None
    """None when the provider has no row yet: healthy, bucket full."""


async def ask_to_send(pool: AsyncConnectionPool, provider: Provider, send: Send) -> Asked:
    """Whether ``send`` may go out to ``provider`` now."""
    async with pool.connection() as conn:
        if send is not Send.RETRY:
            async with autocommit(conn):
                found = await _read(conn, _READ, provider.name)
            if found is None:
                return Asked(
                    admission=Admission(admitted=True, health=ProviderHealth.HEALTHY), row=None
                )
            row, now = found
            admission, _ = admit(row, provider, send, now)
            return Asked(admission=admission, row=row)
        row, now = await _lock(conn, provider)
        admission, after = admit(row, provider, send, now)
        if after != row:
            await _write(conn, provider.name, after)
        return Asked(admission=admission, row=after)


async def tell_answer(
    pool: AsyncConnectionPool,
    provider: Provider,
    send: Send,
    answer: Answer,
    known: BudgetRow | None,
    *,
    throttled_for: timedelta = timedelta(0),
) -> None:
    """Let the provider's row hear how it answered ``send``; ``known``: the row as the
    send's admission saw it. Nothing is written when a healthy provider with a full
    bucket answered a first attempt (the common case)."""
    if send is not Send.RETRY and (
        answer is Answer.NOT_SENT
        or (answer is Answer.ANSWERED and _full_and_healthy(provider, known))
    ):
        return
    async with pool.connection() as conn:
        row, now = await _lock(conn, provider)
        after = after_answer(row, provider, send, answer, now, throttled_for=throttled_for)
        if after != row:
            await _write(conn, provider.name, after)


def _full_and_healthy(provider: Provider, row: BudgetRow | None) -> bool:
    return row is None or (row.failing_since is None and row.tokens >= provider.retry_tokens)


@dataclass(frozen=True, kw_only=True)
class ProviderState:
    """One provider's row as the fleet sees it now (``health(provider)`` says its state)."""

    name: str
    row: BudgetRow
    now: datetime

    def health(self, provider: Provider) -> ProviderHealth:
        return self.row.health(provider, self.now)

    def tokens(self, provider: Provider) -> float:
        """The bucket's tokens now."""
        return self.row.refilled(provider, self.now).tokens


async def provider_states(pool: AsyncConnectionPool) -> list[ProviderState]:
    """Every provider the fleet has a row for, by name."""
    async with pool.connection() as conn, autocommit(conn):
        cursor = conn.cursor(row_factory=dict_row)
        rows = await (await cursor.execute(_READ_ALL)).fetchall()
    return [
        ProviderState(name=found["provider"], row=_row(found), now=found["now"]) for found in rows
    ]


@dataclass(frozen=True, kw_only=True)
class PauseRecord:
    """One pause or resume of a provider, as audited."""

    action: str
    operator: str
    reason: str
    at: datetime


async def pause_provider(
    pool: AsyncConnectionPool, provider: Provider, *, operator: str, reason: str
) -> Pause | None:
    """Pause ``provider`` fleet-wide and audit it; the pause already in force (left as
    it is, and not audited again) when it was paused."""
    async with pool.connection() as conn:
        row, now = await _lock(conn, provider)
        if row.pause is not None:
            return row.pause
        await _write(
            conn, provider.name, replace(row, pause=Pause(by=operator, at=now, reason=reason))
        )
        await conn.execute(
            _AUDIT,
            {"provider": provider.name, "action": "pause", "operator": operator, "reason": reason},
        )
    return None


async def resume_provider(
    pool: AsyncConnectionPool, provider: Provider, *, operator: str, reason: str
) -> Pause | None:
    """Resume a paused ``provider`` and audit it; the pause it ended, or None when it
    was not paused (nothing changed, nothing audited)."""
    async with pool.connection() as conn:
        row, _ = await _lock(conn, provider)
        if row.pause is None:
            return None
        await _write(conn, provider.name, replace(row, pause=None))
        await conn.execute(
            _AUDIT,
            {"provider": provider.name, "action": "resume", "operator": operator, "reason": reason},
        )
    return row.pause


async def pause_history(
    pool: AsyncConnectionPool, name: str, *, limit: int = 20
) -> list[PauseRecord]:
    """The latest pauses and resumes of the provider ``name``, newest first."""
    async with pool.connection() as conn, autocommit(conn):
        cursor = conn.cursor(row_factory=dict_row)
        rows = await (await cursor.execute(_HISTORY, {"provider": name, "limit": limit})).fetchall()
    return [PauseRecord(**row) for row in rows]


async def _lock(conn: AsyncConnection[Any], provider: Provider) -> tuple[BudgetRow, datetime]:
    """The provider's row under its lock (made, full, if it had none)."""
    await conn.execute(_ENSURE, {"provider": provider.name, "tokens": provider.retry_tokens})
    found = await _read(conn, _LOCK, provider.name)
    assert found is not None  # just ensured, and rows are never deleted
    return found


async def _read(
    conn: AsyncConnection[Any], query: str, name: str
) -> tuple[BudgetRow, datetime] | None:
    cursor = conn.cursor(row_factory=dict_row)
    found = await (await cursor.execute(query, {"provider": name})).fetchone()
    return None if found is None else (_row(found), found["now"])


def _row(found: dict[str, Any]) -> BudgetRow:
    pause = None
    if found["paused_at"] is not None:
        pause = Pause(by=found["paused_by"], at=found["paused_at"], reason=found["pause_reason"])
    return BudgetRow(
        tokens=found["tokens"],
        failing_since=found["failing_since"],
        refilled_at=found["refilled_at"],
        hold_until=found["hold_until"],
        pause=pause,
    )


async def _write(conn: AsyncConnection[Any], name: str, row: BudgetRow) -> None:
    pause = row.pause
    await conn.execute(
        _WRITE,
        {
            "provider": name,
            "tokens": row.tokens,
            "failing_since": row.failing_since,
            "refilled_at": row.refilled_at,
            "hold_until": row.hold_until,
            "paused_at": pause.at if pause else None,
            "paused_by": pause.by if pause else None,
            "pause_reason": pause.reason if pause else None,
        },
    )


@asynccontextmanager
async def watch_provider_health(
    pool: AsyncConnectionPool, providers: Iterable[Provider], *, every: timedelta
) -> AsyncIterator[None]:
    """Publish ``onceflow_provider_state`` (a gauge per provider and state: 1 for the state
    it is in, 0 for the others), read from the providers' rows every ``every``."""
    declared = {provider.name: provider for provider in providers}
    seen: dict[str, ProviderHealth] = dict.fromkeys(declared, ProviderHealth.HEALTHY)

    def observe(_: CallbackOptions) -> Iterator[Observation]:
        for name, health in seen.items():
            for state in ProviderHealth:
                yield Observation(int(state is health), {"provider": name, "state": state.value})

    metrics.get_meter("onceflow").create_observable_gauge(
        "onceflow_provider_state",
        callbacks=[observe],
        description="Each provider's state across the fleet: 1 for the state it is in.",
    )

    async def refresh() -> None:
        while True:
            try:
                for state in await provider_states(pool):
                    if state.name in declared:
                        seen[state.name] = state.health(declared[state.name])
            except Exception as error:  # a database hiccup must not stop the worker
                _log.warning("could not read the providers' state: %s", type(error).__name__)
            await asyncio.sleep(every.total_seconds())

    watcher = asyncio.create_task(refresh())
    try:
        yield
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
