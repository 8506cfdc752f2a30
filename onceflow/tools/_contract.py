"""Effect contracts: what a tool does to the world and what makes a repeat safe."""

from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from enum import StrEnum
from typing import Any

from pydantic import BaseModel


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


@dataclass(frozen=True, kw_only=True)
class EffectFlags:
    """What a tool does, in the vocabulary of MCP tool annotations."""

    read_only: bool = False
    """Changes nothing in the world."""
    destructive: bool = False
    """May destroy or undo something (a refund, a deployment replacing a version)."""
    idempotent: bool = False
    """Repeating the same call with the same arguments has no further effect."""
    open_world: bool = True
    """Reaches outside onceflow's own database (a payment provider, SMTP, a target)."""


@dataclass(frozen=True, kw_only=True)
class ApprovalThreshold:
    """Approval is needed only when a numeric argument exceeds a limit."""

    argument: str
    """Name of the input field compared (e.g. ``amount``)."""
    above: Decimal
    """Calls with the argument strictly above this need approval."""


@dataclass(frozen=True, kw_only=True)
class ToolContract:
    """A named operation with a typed input and an effect contract.

    Pure data: the workflow reads it to decide about approval and retries, the boundary
    reads it to validate input and to publish MCP annotations.
    """

    name: str
    """Tool name; also the name of the activity that performs it."""
    description: str
    """One sentence for agents and operators."""
    input_model: type[BaseModel]
    """The pydantic model the arguments must validate against."""
    effects: EffectFlags
    """What the tool does to the world."""
    dedupe: DedupeStrategy
    """What makes a repeat safe."""
    start_to_close_timeout: timedelta | None = None
    """Longest time one attempt may run before its outcome counts as unknown. Required:
    registration refuses a tool without one (an attempt with no limit could hang forever
    with its outcome unknown). Default None, i.e. not set."""
    requires_approval: bool = False
    """Whether a person must approve the exact arguments before the first attempt."""
    approval_threshold: ApprovalThreshold | None = None
    """With ``requires_approval``: approval only above this limit; None means always."""
    provider_key_retention: timedelta | None = None
    """How long the provider remembers an idempotency key (Stripe: about 24 h)."""
    retention_margin: timedelta = field(default=timedelta(hours=1))
    """Safety margin subtracted from ``provider_key_retention`` before repeating."""
    lookup_activity: str | None = None
    """Activity that looks the effect up by its correlation ids before the step parks.

    It returns ``succeeded`` with the resource when it found the effect; anything else
    is inconclusive and the step parks with the lookup's evidence.
    """
    heartbeat_timeout: timedelta | None = None
    """Longest silence between an attempt's heartbeats before Temporal ends the attempt
    (its outcome then counts as unknown), so a dead or paused worker is noticed long
    before ``start_to_close_timeout``. None: no heartbeats expected. Default None."""

    @property
    def attempt_timeout(self) -> timedelta:
        """``start_to_close_timeout``, which the catalogue refuses to register unset."""
        if self.start_to_close_timeout is None:
            raise ValueError(f"tool {self.name!r} has no start_to_close_timeout")
        return self.start_to_close_timeout

    def needs_approval(self, args: BaseModel) -> bool:
        """Whether these validated arguments must be approved before the first attempt."""
        if not self.requires_approval:
            return False
        if self.approval_threshold is None:
            return True
        value = getattr(args, self.approval_threshold.argument)
        if value is None:
            # An omitted amount (a full refund) is not known to be below the limit.
            return True
        return Decimal(str(value)) > self.approval_threshold.above

    def safe_repeat_window(self, first_attempt_age: timedelta) -> timedelta | None:
        """For how much longer repeating the operation is provably harmless.

        Args:
            first_attempt_age: Time since the step's first attempt started; a provider
                forgets keys older than its retention, after which a repeat is new.

        Returns:
            ``None`` when a repeat is always safe, ``timedelta(0)`` when it never is,
            else the time left before the provider may forget the key (minus a margin).
        """
        if self.dedupe in (
            DedupeStrategy.NATURAL_KEY,
            DedupeStrategy.LOCAL_TRANSACTION,
            DedupeStrategy.FENCED_LEASE,
        ):
            return None
        if self.dedupe is DedupeStrategy.PROVIDER_IDEMPOTENCY_KEY and self.provider_key_retention:
            left = self.provider_key_retention - self.retention_margin - first_attempt_age
            return max(left, timedelta(0))
        return timedelta(0)

    def mcp_annotations(self) -> dict[str, Any]:
        """MCP tool annotations derived from the effect flags (never written twice)."""
        return {
            "title": self.name.replace("_", " "),
            "readOnlyHint": self.effects.read_only,
            "destructiveHint": self.effects.destructive,
            "idempotentHint": self.effects.idempotent,
            "openWorldHint": self.effects.open_world,
        }
