"""The dedupe strategies: what makes running the same operation twice harmless."""

from enum import StrEnum


class DedupeStrategy(StrEnum):
    """The mechanism that makes running the same operation twice harmless, if any."""

    NATURAL_KEY = "natural_key"
    """A unique constraint on the business key (e.g. one coupon per user and coupon)."""
    LOCAL_TRANSACTION = "local_transaction"
    """The effect and its succeeded record commit together, keyed by the child key."""
    PROVIDER_IDEMPOTENCY_KEY = "provider_idempotency_key"
    """The provider dedupes the child key, but only within its key retention."""
    OUTBOX = "outbox"
    """An outbox row with a unique event id; delivery itself cannot be deduped remotely."""
    FENCED_LEASE = "fenced_lease"
    """A lease whose fencing token the protected resource checks on every write."""
    NONE = "none"
    """Nothing dedupes a repeat: an unknown outcome always parks."""
