"""Effect contracts: what a tool does to the world and what makes a repeat safe."""

from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

from pydantic import BaseModel

from onceflow.tools._dedupe import DedupeStrategy
from onceflow.tools._intent import IntentIdentity
from onceflow.tools._policy import DEFAULT_PROVIDER_WAIT_LIMIT, ToolPolicy
from onceflow.tools._provider import Provider

__all__ = ["ApprovalThreshold", "DedupeStrategy", "EffectFlags", "ToolContract"]


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
    provider_settle_time: timedelta = field(default=timedelta(minutes=5))
    """Longest a request may still take effect at the provider after the attempt that
    sent it ended (a provider can finish a request its client gave up on). Before an
    operator-authorised attempt goes out under a new key, the task waits this long after
    the old key's last attempt and looks the effect up again. Default 5 min (Stripe's
    own SDKs give up on a request after 80 s)."""
    lookup_activity: str | None = None
    """Activity that looks the effect up by its correlation ids before the step parks.

    It returns ``succeeded`` with the resource when it found the effect; anything else
    is inconclusive and the step parks with the lookup's evidence.
    """
    lookup_verifies_resource_ids: bool = False
    """Whether the look-up checks an operator's ``happened --resource-id`` (given as
    ``ToolCallInput.claimed_resource_id``): it answers ``succeeded`` only when that
    resource exists and belongs to the step, and records it where later steps read it.
    With False, ``happened`` is accepted unverified. Default False."""
    heartbeat_timeout: timedelta | None = None
    """Longest silence between an attempt's heartbeats before Temporal ends the attempt
    (its outcome then counts as unknown), so a dead or paused worker is noticed long
    before ``start_to_close_timeout``. None: no heartbeats expected. Default None."""
    deliberate_repeats: bool = True
    """Whether a call of an open task may ask for a second effect identical to an
    earlier call's (``CallInput.deliberate_repeat``); with False such a call is refused
    and only the repeat guard's answer is given. Default True."""
    intent: IntentIdentity | None = field(default_factory=IntentIdentity)
    """What identifies one business intent of this tool (``IntentIdentity``): while one
    call holds it, an identical intent from any key, task, surface or process sends
    nothing and is answered with the first. Default: all the validated arguments, for
    24 h. None: no intent rule (a read-only tool, or one whose own table's unique key
    already is the intent, as ``issue_coupon``'s)."""
    provider: Provider | None = None
    """The service its sends reach (``Provider``), whose retry budget and pause switch it
    shares with the provider's other tools across the fleet. Default None: an open-world
    tool that changes something gets a provider of its own, named after it; a read-only
    or local tool none."""
    provider_wait_limit: timedelta = DEFAULT_PROVIDER_WAIT_LIMIT
    """Longest one step waits, in all, for its provider (its retry budget empty, a pause,
    a 429's "not now") before it fails, or parks if its outcome is in doubt. The wait
    spends neither the step's attempts nor the task's deadline. Default 1 hour."""
    version: str = "1"
    """The contract's version, pinned with the rest of its policy by every task that
    starts with it; bump it when the tool's behaviour changes. Default ``"1"``."""

    @property
    def budget_provider(self) -> Provider | None:
        """The provider whose budget the tool's sends draw on (``provider``, or one of its
        own for an open-world tool that changes something), or None."""
        if self.provider is not None:
            return self.provider
        if self.effects.read_only or not self.effects.open_world:
            return None
        return Provider(name=self.name)

    @property
    def attempt_timeout(self) -> timedelta:
        """``start_to_close_timeout``, which the catalogue refuses to register unset."""
        if self.start_to_close_timeout is None:
            raise ValueError(f"tool {self.name!r} has no start_to_close_timeout")
        return self.start_to_close_timeout

    def policy(self) -> ToolPolicy:
        """The values a task pins from this contract when it starts (``ToolPolicy``)."""
        return ToolPolicy.from_contract(self)

    def needs_approval(self, args: BaseModel) -> bool:
        """Whether these validated arguments must be approved before the first attempt."""
        return self.policy().needs_approval(args)

    def safe_repeat_window(self, first_attempt_age: timedelta) -> timedelta | None:
        """For how much longer repeating the operation is provably harmless (see
        ``ToolPolicy.safe_repeat_window``)."""
        return self.policy().safe_repeat_window(first_attempt_age)

    def mcp_annotations(self) -> dict[str, Any]:
        """MCP tool annotations derived from the effect flags (never written twice)."""
        return {
            "title": self.name.replace("_", " "),
            "readOnlyHint": self.effects.read_only,
            "destructiveHint": self.effects.destructive,
            "idempotentHint": self.effects.idempotent,
            "openWorldHint": self.effects.open_world,
        }
