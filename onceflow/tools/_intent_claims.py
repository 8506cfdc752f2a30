"""The intents' record in PostgreSQL: one row per (tenant, tool, intent digest) naming the
step that holds it. Taking it is one atomic upsert, so of any number of concurrent calls
of one intent (any gateway, worker or task) exactly one sends."""

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from onceflow.tools._intent import IntentState

CLAIM = """
INSERT INTO intents AS held (tenant, tool, intent_digest, workflow_id, step_id, state,
                             maybe_effect, expires_at)
VALUES (%(tenant)s, %(tool)s, %(digest)s, %(workflow_id)s, %(step_id)s, 'running', false,
        now() + %(window)s)
ON CONFLICT (tenant, tool, intent_digest) DO UPDATE SET
    workflow_id = excluded.workflow_id,
    step_id = excluded.step_id,
    state = 'running',
    -- The holder's own next attempt: an earlier one that was unknown, or died sending,
    -- may have made the effect. A new holder starts clean, with a new window.
    maybe_effect = CASE WHEN held.workflow_id = excluded.workflow_id
                         AND held.step_id = excluded.step_id
                        THEN held.maybe_effect OR held.state IN ('running', 'unknown')
                        ELSE false END,
    expires_at = CASE WHEN held.workflow_id = excluded.workflow_id
                       AND held.step_id = excluded.step_id
                      THEN held.expires_at ELSE excluded.expires_at END,
    resource_id = NULL,
    result = NULL,
    claimed_at = now()
WHERE (held.workflow_id = excluded.workflow_id AND held.step_id = excluded.step_id)
   OR held.state = 'no_effect'
   -- A window frees a known effect only: one that may or may not exist stays held (its
   -- step parks for a person) until a deliberate repeat says otherwise.
   OR (held.state = 'succeeded' AND held.expires_at <= now())
RETURNING true AS taken
"""

READ_HOLDER = """
SELECT workflow_id, step_id, state, resource_id, result
FROM intents WHERE tenant = %(tenant)s AND tool = %(tool)s AND intent_digest = %(digest)s
"""

SETTLE = """
UPDATE intents
SET state = CASE WHEN %(state)s = 'succeeded' THEN 'succeeded'
                 WHEN %(state)s = 'unknown' OR maybe_effect THEN 'unknown'
                 ELSE 'no_effect' END,
    maybe_effect = maybe_effect OR %(state)s IN ('unknown', 'succeeded'),
    resource_id = %(resource_id)s,
    result = %(result)s
WHERE tenant = %(tenant)s AND tool = %(tool)s AND intent_digest = %(digest)s
  AND workflow_id = %(workflow_id)s AND step_id = %(step_id)s
"""

# Settled rows past their window answer nothing any more: a new call takes them over
# anyway. Rows whose effect is in doubt stay, however old.
PRUNE = """
DELETE FROM intents WHERE ctid IN (
    SELECT ctid FROM intents
    WHERE state IN ('succeeded', 'no_effect') AND expires_at <= now()
    LIMIT %(batch)s
)
"""

RECORD_DELIBERATE = """
INSERT INTO intent_deliberate_repeats (tenant, tool, intent_digest, workflow_id, step_id)
VALUES (%(tenant)s, %(tool)s, %(digest)s, %(workflow_id)s, %(step_id)s)
ON CONFLICT DO NOTHING
"""


@dataclass(frozen=True)
class IntentHolder:
    """The step that holds an intent another call asked for."""

    workflow_id: str
    step_id: str
    state: IntentState
    resource_id: str | None
    result: dict[str, Any]


@dataclass(frozen=True)
class IntentKey:
    """One intent and the step asking for it."""

    tenant: str
    tool: str
    digest: str
    workflow_id: str
    step_id: str

    def params(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "tool": self.tool,
            "digest": self.digest,
            "workflow_id": self.workflow_id,
            "step_id": self.step_id,
        }


async def claim_intent(
    conn: AsyncConnection[Any], key: IntentKey, window: timedelta
) -> IntentHolder | None:
    """Take the intent for ``key``'s step (or keep it); None when taken, else the other
    step that holds it."""
    params = {**key.params(), "window": window}
    taken = await (await conn.execute(CLAIM, params)).fetchone()
    if taken is not None:
        return None
    cursor = conn.cursor(row_factory=dict_row)
    row = await (await cursor.execute(READ_HOLDER, params)).fetchone()
    if row is None:  # released between the two statements: take it again
        return await claim_intent(conn, key, window)
    return IntentHolder(
        workflow_id=row["workflow_id"],
        step_id=row["step_id"],
        state=IntentState(row["state"]),
        resource_id=row["resource_id"],
        result=row["result"] or {},
    )


async def settle_intent(
    conn: AsyncConnection[Any],
    key: IntentKey,
    state: IntentState,
    *,
    resource_id: str | None = None,
    result: dict[str, Any] | None = None,
) -> None:
    """Record what the holder's attempt (or look-up) found; nothing if it no longer
    holds the intent."""
    await conn.execute(
        SETTLE,
        {
            **key.params(),
            "state": state.value,
            "resource_id": resource_id,
            "result": Jsonb(result) if result is not None else None,
        },
    )


async def prune_intents(pool: AsyncConnectionPool, *, batch: int = 1000) -> int:
    """Delete settled intents past their window, ``batch`` rows a transaction."""
    deleted = 0
    while True:
        async with pool.connection() as conn:
            cursor = await conn.execute(PRUNE, {"batch": batch})
            await conn.commit()
        deleted += cursor.rowcount
        if cursor.rowcount < batch:
            return deleted


async def record_deliberate_repeat(conn: AsyncConnection[Any], key: IntentKey) -> None:
    """Record that ``key``'s step makes the intent's effect again on purpose."""
    await conn.execute(RECORD_DELIBERATE, key.params())
