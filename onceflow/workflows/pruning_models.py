"""Input and result of pruning the boundary's idempotency records."""

from pydantic import BaseModel, Field

PRUNE_IDEMPOTENCY_RECORDS = "prune_idempotency_records"
"""Name of the activity that deletes expired terminal idempotency records."""


class PruneInput(BaseModel):
    """One prune pass."""

    batch: int = Field(default=1000, ge=1, le=100_000)
    """Rows deleted per statement, so one pass never holds long locks. Default 1000."""


class PruneResult(BaseModel):
    """What one prune pass deleted."""

    records: int
    """Terminal idempotency records past their ``result_expires_at``."""
    usage_windows: int
    """Key-quota windows older than a day."""
