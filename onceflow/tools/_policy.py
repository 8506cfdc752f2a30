"""Pinned policy: every value of a tool's contract that a workflow decision depends on,
as plain data resolved once when a task starts and carried in the task's history.

    ToolContract (code + the admitting process's settings)
        ──ToolPolicy.from_contract──▶ ToolPolicy, carried in the task's start input
        (``AgentTaskInput.policies``) or the call's (``CallInput.policy``) by
        ``TaskClient``, then read by every replay on every worker

A process restarted with other settings builds other contracts, which only tasks
started afterwards pin; a task in flight keeps deciding by its own ``ToolPolicy``. A task
started without policies (by hand, with ``temporal workflow start``) is refused; one
started so before 0.3.0 pins them with the local activity ``pin_task_policy``, as every
task once did (patch ``policies-carried-no-pin``). Pure code: no I/O, no clock.
"""

from collections.abc import Mapping
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from onceflow.tools._dedupe import DedupeStrategy

if TYPE_CHECKING:
    from onceflow.tools._contract import ToolContract

DEFAULT_PROVIDER_WAIT_LIMIT = timedelta(hours=1)
"""``ToolContract.provider_wait_limit``'s default."""
PIN_TASK_POLICY = "pin_task_policy"
"""Name of the local activity that resolves a task's ``TaskPolicy`` on its first run."""

_ALWAYS_SAFE = (
    DedupeStrategy.NATURAL_KEY,
    DedupeStrategy.LOCAL_TRANSACTION,
    DedupeStrategy.FENCED_LEASE,
)


class ToolPolicy(BaseModel):
    """What a task decides from about one tool, fixed for the task's whole life."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tool: str
    """The tool's name (also its activity's)."""
    contract_version: str = "1"
    """``ToolContract.version`` when the task pinned it. Default ``"1"``."""
    dedupe: DedupeStrategy
    """What makes a repeat safe."""
    key_retention: timedelta | None = None
    """How long the provider remembers an idempotency key; None if it never forgets or
    the strategy is not a provider key. Default None."""
    retention_margin: timedelta = timedelta(0)
    """Subtracted from ``key_retention`` for the send-by deadline. Default 0."""
    settle_time: timedelta = timedelta(minutes=5)
    """Longest a request may still take effect at the provider after its attempt ended
    (``ToolContract.provider_settle_time``). Default 5 min."""
    requires_approval: bool = False
    """A person approves the exact arguments before the first attempt. Default False."""
    approval_argument: str | None = None
    """With a threshold: the numeric argument compared. Default None (always approve)."""
    approval_above: Decimal | None = None
    """With a threshold: calls with the argument strictly above this need approval."""
    attempt_timeout: timedelta = Field(gt=timedelta(0))
    """Start-to-close limit of one attempt (and one look-up)."""
    heartbeat_timeout: timedelta | None = None
    """Longest silence between an attempt's heartbeats. Default None (none expected)."""
    lookup_activity: str | None = None
    """Activity that looks the effect up before a step parks. Default None."""
    lookup_verifies_resource_ids: bool = False
    """The look-up checks an operator's ``happened`` resource id. Default False."""
    deliberate_repeats: bool = True
    """A call may ask for a second identical effect (``ToolContract.deliberate_repeats``).
    Default True."""
    provider_wait_limit: timedelta = Field(
        default=DEFAULT_PROVIDER_WAIT_LIMIT,
        exclude_if=lambda limit: limit == DEFAULT_PROVIDER_WAIT_LIMIT,
    )
    """Longest a step waits, in all, for its provider's budget to let it send
    (``ToolContract.provider_wait_limit``). Default 1 hour. Written only when it differs,
    so a policy with the default is what an earlier release (which forbids unknown
    fields) decodes, in a fleet whose workers are being replaced one by one."""

    @classmethod
    def from_contract(cls, contract: "ToolContract") -> "ToolPolicy":
        """The policy ``contract`` stands for under this process's settings."""
        threshold = contract.approval_threshold
        keyed = contract.dedupe is DedupeStrategy.PROVIDER_IDEMPOTENCY_KEY
        return cls(
            tool=contract.name,
            contract_version=contract.version,
            dedupe=contract.dedupe,
            key_retention=contract.provider_key_retention if keyed else None,
            retention_margin=contract.retention_margin if keyed else timedelta(0),
            settle_time=contract.provider_settle_time,
            requires_approval=contract.requires_approval,
            approval_argument=threshold.argument if threshold else None,
            approval_above=threshold.above if threshold else None,
            attempt_timeout=contract.attempt_timeout,
            heartbeat_timeout=contract.heartbeat_timeout,
            lookup_activity=contract.lookup_activity,
            lookup_verifies_resource_ids=(
                contract.lookup_verifies_resource_ids and contract.lookup_activity is not None
            ),
            deliberate_repeats=contract.deliberate_repeats,
            provider_wait_limit=contract.provider_wait_limit,
        )

    @property
    def forgets_keys(self) -> bool:
        """Whether repeats are safe only before a send-by deadline (a provider key that
        the provider forgets after ``key_retention``)."""
        return self.dedupe is DedupeStrategy.PROVIDER_IDEMPOTENCY_KEY and bool(self.key_retention)

    @property
    def send_window(self) -> timedelta | None:
        """``key_retention - retention_margin`` for a provider that forgets keys, else None."""
        if not self.forgets_keys or self.key_retention is None:
            return None
        return self.key_retention - self.retention_margin

    def send_by(self, first_sent_at: datetime) -> datetime | None:
        """The send-by deadline of a key first sent at ``first_sent_at``: past it nothing
        may be sent under the key. None when the key never expires."""
        window = self.send_window
        return None if window is None else first_sent_at + window

    def needs_approval(self, args: BaseModel | Mapping[str, Any]) -> bool:
        """Whether these validated arguments (the model, or the normalized JSON a task
        recorded at admission) must be approved before the first attempt."""
        if not self.requires_approval:
            return False
        if self.approval_argument is None or self.approval_above is None:
            return True
        if isinstance(args, Mapping):
            value = args.get(self.approval_argument)
        else:
            value = getattr(args, self.approval_argument)
        if value is None:
            # An omitted amount (a full refund) is not known to be below the limit.
            return True
        try:
            return Decimal(str(value)) > self.approval_above
        except ArithmeticError:
            return True  # not a number: not known to be below the limit either

    def safe_repeat_window(self, first_attempt_age: timedelta) -> timedelta | None:
        """For how much longer repeating the operation is provably harmless.

        Args:
            first_attempt_age: Time since the step's first attempt started; a provider
                forgets keys older than its retention, after which a repeat is new.

        Returns:
            ``None`` when a repeat is always safe, ``timedelta(0)`` when it never is,
            else the time left before the provider may forget the key (minus a margin).
        """
        if self.dedupe in _ALWAYS_SAFE:
            return None
        window = self.send_window
        if window is not None:
            return max(window - first_attempt_age, timedelta(0))
        return timedelta(0)


class TaskPolicy(BaseModel):
    """Every tool's pinned policy for one task, by tool name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tools: dict[str, ToolPolicy]


class PinPolicyInput(BaseModel):
    """The tools a task uses, for ``pin_task_policy``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tools: list[str]
