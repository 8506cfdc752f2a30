"""Input and result of pruning the boundary's idempotency records."""

from pydantic import BaseModel, Field

PRUNE_IDEMPOTENCY_RECORDS = "prune_idempotency_records"
"""Name of the activity that deletes expired terminal idempotency records."""


class PruneInput(BaseModel):
    """One upkeep pass of the records."""

    batch: int = Field(default=1000, ge=1, le=100_000)
    """Rows deleted per statement, so one pass never holds long locks. Default 1000."""
    settle_after_seconds: float = Field(default=300.0, ge=0)
    """A started task's record waits this long for its starter (the gateway request that
    awaits the task) before the pass writes the ended task's outcome itself. Default 300."""


class PruneResult(BaseModel):
    """What one upkeep pass wrote and deleted."""

    records: int
    """Terminal idempotency records past their ``result_expires_at``."""
    usage_windows: int
    """Key-quota windows older than a day."""
    settled: int = 0
    """Records of ended tasks whose outcome the pass wrote (their starter had died)."""
    intents: int = 0
    """Settled intents past their window (``tools/_intent_claims``)."""
