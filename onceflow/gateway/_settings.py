"""The boundary's settings (``ONCEFLOW_GATEWAY_*``, ``[gateway]``) and the retention check
made at start-up."""

from datetime import timedelta

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from onceflow.errors import OnceflowError
from onceflow.retry_policy import RetryBudget
from onceflow.settings import FileBackedSettings, InvalidSettings, read_settings


class GatewaySettings(FileBackedSettings):
    """How long records live, how long claims and waits last, and how many keys a
    principal may create; read from ``ONCEFLOW_GATEWAY_<FIELD>`` and the file's
    ``[gateway]``."""

    config_table = "gateway"
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_GATEWAY_", extra="ignore")

    result_retention_seconds: float = Field(default=86_400.0, gt=0)
    """How long a terminal result stays replayable after the task ended. Must exceed the
    longest retry window of any task budget; after it the record may be pruned and a
    retry with the same key is a new operation. Default 86400 (24 h)."""
    claim_lease_seconds: float = Field(default=30.0, gt=0, le=3600)
    """How long a fresh claim is owned before another request may take it over, covering
    only the window between claiming the key and starting the task. Default 30."""
    replay_wait_seconds: float = Field(default=10.0, ge=0, le=300)
    """How long a request waits for a running task's result before answering 202 (or 409
    while the claim's owner has not marked the task started). Default 10."""
    quota_window_seconds: int = Field(default=60, ge=1, le=86_400)
    """Length of the fixed window in which each principal's new keys are counted. Default 60."""
    default_key_quota: int = Field(default=1000, ge=1)
    """New idempotency keys per principal per window, for principals created without their
    own quota. Default 1000."""
    prune_interval_seconds: float = Field(default=3600.0, ge=1)
    """How often the prune schedule deletes expired terminal records. Default 3600."""
    db_pool_max_size: int = Field(default=20, ge=1, le=200)
    """Most database connections one gateway process holds. Default 20."""
    answer_cache_size: int = Field(default=10_000, ge=0, le=1_000_000)
    """Most final answers of idempotency records one gateway process keeps in memory, so
    a storm of repeats of a finished request is answered without a database read per
    request (the least recently answered go first; each goes with its record's retention,
    a prune pass or any principal's change, and none is kept while the gateway cannot hear
    those). 0 keeps none: every repeat reads its record. Default 10000."""
    readiness_timeout_seconds: float = Field(default=2.0, gt=0, le=60)
    """How long ``GET /readyz`` waits for PostgreSQL and for Temporal (both at once)
    before it reports the one that has not answered as down; a probe's own timeout
    must be longer. Default 2."""

    @property
    def result_retention(self) -> timedelta:
        """``result_retention_seconds`` as a duration."""
        return timedelta(seconds=self.result_retention_seconds)

    @property
    def claim_lease(self) -> timedelta:
        """``claim_lease_seconds`` as a duration."""
        return timedelta(seconds=self.claim_lease_seconds)


class RetentionTooShort(OnceflowError, ValueError):
    """Result retention does not outlast the longest retry window: refuse to start."""

    code = "retention-too-short"
    title = "Result retention too short"


class InvalidGatewaySettings(InvalidSettings):
    """A gateway setting (``ONCEFLOW_GATEWAY_*``, ``[gateway]``) the boundary cannot use."""


def load_gateway_settings() -> GatewaySettings:
    """Read and check the settings; raises ``InvalidGatewaySettings`` or ``RetentionTooShort``."""
    try:
        settings = read_settings(GatewaySettings)
    except InvalidSettings as invalid:
        raise InvalidGatewaySettings(*invalid.problems) from None
    check_retention(settings)
    return settings


def check_retention(settings: GatewaySettings, budget: RetryBudget | None = None) -> None:
    """Refuse a result retention that a retry inside the budget's window could outlive.

    A caller retries for as long as the task may; if the record were pruned earlier, a
    late retry would silently become a new operation.
    """
    window = (budget or RetryBudget()).longest_retry_window
    if settings.result_retention <= window:
        raise RetentionTooShort(
            f"ONCEFLOW_GATEWAY_RESULT_RETENTION_SECONDS={settings.result_retention_seconds:g} "
            f"is not longer than the longest retry window ({window.total_seconds():g} s); "
            "a late retry could become a new operation"
        )
