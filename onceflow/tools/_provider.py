"""The service a tool's sends reach, declared once by its family and shared by every task
and worker: its retry budget, how it is probed while it fails, its documented rate limit.

    first attempt ──▶ sent (unless the provider is paused or said "not now")
    retry         ──▶ takes a token; with none left the step waits (a durable timer,
                      off the task's clock) for the next: the bucket refills by one
                      token per ``probe_every``, so a failing provider gets one retry
                      per interval, the probe that learns it answers again
    answer        ──▶ deposits ``retry_deposit``, and a retry's repays its token; the
                      first answer after failures refills the bucket
    429 "not now" ──▶ every send waits until the provider's ``Retry-After`` (or
                      ``throttle_hold``) has passed

Pure data and pure policy: the rows live in PostgreSQL (``_provider_budgets``), the
workflow only reads each answer from an activity result.
"""

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum


@dataclass(frozen=True, kw_only=True)
class Provider:
    """A service several tools reach (Stripe for ``charge_payment`` and ``refund_payment``):
    one retry budget and one pause switch for all of them, fleet-wide.

    Example::

        LEDGERPAY = Provider(name="ledgerpay", requests_per_second=50)
        ToolContract(name="ledgerpay_charge", ..., provider=LEDGERPAY)

    Bound: in any interval T in which the provider answers nothing, the retries the whole
    fleet sends it are at most ``retry_tokens`` (what the bucket held) plus
    T / ``probe_every``; first attempts are never held by the bucket.
    """

    name: str
    """The provider's name (``stripe``): the budget's row, the pause switch
    (``onceflow provider pause stripe``), what a waiting step names."""
    retry_tokens: float = 5.0
    """The bucket's size: how many retries may go out back to back before the provider
    has answered any of them. Default 5."""
    retry_deposit: float = 0.1
    """Tokens each successful attempt adds (up to ``retry_tokens``): in steady failure,
    retries stay within this share of successes. Default 0.1 (gRPC's ``tokenRatio``)."""
    probe_every: timedelta = timedelta(seconds=10)
    """The bucket refills by one token per this interval: while the provider fails, one
    retry per interval goes out, fleet-wide, to learn whether it answers again.
    Default 10 s."""
    throttle_hold: timedelta = timedelta(seconds=1)
    """How long every send waits after a 429 that named no ``Retry-After``. Default 1 s."""
    requests_per_second: float | None = None
    """The provider's documented rate limit for the whole fleet (Stripe live mode: 100
    read/write per second). Default None: none declared."""

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(
                f"provider name {self.name!r}: use letters, digits, '-' and '_' (e.g. 'stripe')"
            )
        if self.retry_tokens < 1:
            raise ValueError("retry_tokens must be at least 1")
        if not 0 <= self.retry_deposit <= self.retry_tokens:
            raise ValueError("retry_deposit must be between 0 and retry_tokens")
        if self.probe_every <= timedelta(0) or self.throttle_hold <= timedelta(0):
            raise ValueError("probe_every and throttle_hold must be positive")
        if self.requests_per_second is not None and self.requests_per_second <= 0:
            raise ValueError("requests_per_second must be positive")


class ProviderHealth(StrEnum):
    """What the fleet knows of a provider, as its budget's row says."""

    HEALTHY = "healthy"
    """Sends go out; retries draw on the bucket."""
    SHEDDING_RETRIES = "shedding_retries"
    """It fails and the bucket is empty: retries wait, one per ``probe_every`` goes out."""
    THROTTLED = "throttled"
    """It said "not now" (429): every send waits until the time it named."""
    PAUSED = "paused"
    """An operator paused it: nothing is sent until one resumes it."""


class Send(StrEnum):
    """What kind of send asks to go out."""

    FIRST = "first"
    """A step's first attempt, or the first after others that sent nothing: never held
    by the bucket (new work is no retry storm)."""
    RETRY = "retry"
    """A repeat of a step whose earlier attempt reached the provider: takes a token."""
    OPERATOR = "operator"
    """An attempt an operator authorised: a person decided, so no token is asked."""


@dataclass(frozen=True, kw_only=True)
class Pause:
    """Who paused a provider, when and why."""

    by: str
    at: datetime
    reason: str


@dataclass(frozen=True, kw_only=True)
class BudgetRow:
    """A provider's shared state (one row per provider)."""

    tokens: float
    """The bucket's tokens as of ``refilled_at``."""
    refilled_at: datetime | None = None
    """When ``tokens`` was counted; it has refilled since (``refilled``)."""
    failing_since: datetime | None = None
    """Since when its answers have been failures (None once it answers)."""
    hold_until: datetime | None = None
    """Until when it asked every send to wait (a 429)."""
    pause: Pause | None = None

    @classmethod
    def full(cls, provider: Provider) -> "BudgetRow":
        """The row of a provider the fleet has not heard from: healthy, bucket full."""
        return cls(tokens=provider.retry_tokens)

    def refilled(self, provider: Provider, now: datetime) -> "BudgetRow":
        """The row with the bucket refilled up to ``now``: a token per ``probe_every``."""
        if self.refilled_at is None or now <= self.refilled_at:
            return replace(self, refilled_at=self.refilled_at or now)
        earned = (now - self.refilled_at) / provider.probe_every
        return replace(
            self, tokens=min(provider.retry_tokens, self.tokens + earned), refilled_at=now
        )

    def health(self, provider: Provider, now: datetime) -> ProviderHealth:
        if self.pause is not None:
            return ProviderHealth.PAUSED
        if self.hold_until is not None and now < self.hold_until:
            return ProviderHealth.THROTTLED
        if self.failing_since is not None and self.refilled(provider, now).tokens < 1:
            return ProviderHealth.SHEDDING_RETRIES
        return ProviderHealth.HEALTHY


@dataclass(frozen=True, kw_only=True)
class Admission:
    """Whether a send may go out now; if not, why and when to ask again."""

    admitted: bool
    health: ProviderHealth
    recheck_in: timedelta = timedelta(0)
    """When held: how long until asking again can help."""
    reason: str = ""
    """When held: why, naming the provider and its state."""


PAUSE_RECHECK = timedelta(seconds=15)
"""How often a step held by a paused provider asks again."""
BUSY_RECHECK = timedelta(seconds=1)
"""How soon a retry asks again when the bucket is empty only because other retries are
out and the provider has failed none of them."""


def admit(
    row: BudgetRow, provider: Provider, send: Send, now: datetime
) -> tuple[Admission, BudgetRow]:
    """Whether ``send`` may go out now, and the row after it asked."""
    name = provider.name
    if row.pause is not None:
        return Admission(
            admitted=False,
            health=ProviderHealth.PAUSED,
            recheck_in=PAUSE_RECHECK,
            reason=(
                f"{name} is paused by {row.pause.by} since "
                f"{row.pause.at.isoformat(timespec='seconds')} ({row.pause.reason}): nothing "
                f"is sent until an operator runs `onceflow provider resume {name}`"
            ),
        ), row
    if row.hold_until is not None and now < row.hold_until:
        return Admission(
            admitted=False,
            health=ProviderHealth.THROTTLED,
            recheck_in=row.hold_until - now,
            reason=(
                f"{name} asked for no requests until "
                f"{row.hold_until.isoformat(timespec='seconds')} (429 rate limited)"
            ),
        ), row
    if send is not Send.RETRY:
        return Admission(admitted=True, health=row.health(provider, now)), row
    row = row.refilled(provider, now)
    if row.tokens >= 1:
        return Admission(admitted=True, health=ProviderHealth.HEALTHY), replace(
            row, tokens=row.tokens - 1
        )
    recheck_in = (1 - row.tokens) * provider.probe_every
    if row.failing_since is None:
        # Every token is out with retries the provider has not failed (yet): their
        # answers repay them in a moment.
        return Admission(
            admitted=False,
            health=ProviderHealth.HEALTHY,
            recheck_in=min(recheck_in, BUSY_RECHECK),
            reason=f"{name}'s retry budget is out with retries still running",
        ), row
    return Admission(
        admitted=False,
        health=ProviderHealth.SHEDDING_RETRIES,
        recheck_in=recheck_in,
        reason=(
            f"waiting for {name} to recover: it has failed since "
            f"{row.failing_since.isoformat(timespec='seconds')} and its retry budget is "
            f"spent, so one retry per {_seconds(provider.probe_every)} goes out to probe it"
        ),
    ), row


class Answer(StrEnum):
    """How the provider answered a send, as its budget hears it."""

    ANSWERED = "answered"
    """It answered (success, or a refusal of the request itself): it is up."""
    FAILED = "failed"
    """It failed the send (5xx, no answer, refused connection)."""
    THROTTLED = "throttled"
    """It said "not now" (429)."""
    NOT_SENT = "not_sent"
    """Nothing reached it after all (the step's intent was held elsewhere, onceflow's
    database was down): a retry's token goes back."""


def after_answer(
    row: BudgetRow,
    provider: Provider,
    send: Send,
    answer: Answer,
    now: datetime,
    *,
    throttled_for: timedelta = timedelta(0),
) -> BudgetRow:
    """The row once the provider answered ``send`` so."""
    row = row.refilled(provider, now)
    repaid = 1.0 if send is Send.RETRY else 0.0
    if answer is Answer.NOT_SENT:
        return replace(row, tokens=min(provider.retry_tokens, row.tokens + repaid))
    if answer is Answer.ANSWERED:
        if row.failing_since is not None:
            # It answers again: the bucket is whole, and so are the retries waiting.
            return replace(row, tokens=provider.retry_tokens, failing_since=None)
        tokens = row.tokens + repaid + provider.retry_deposit
        return replace(row, tokens=min(provider.retry_tokens, tokens))
    failing = replace(row, failing_since=row.failing_since or now)
    if answer is Answer.THROTTLED:
        hold = throttled_for if throttled_for > timedelta(0) else provider.throttle_hold
        until = now + hold
        if failing.hold_until is None or failing.hold_until < until:
            failing = replace(failing, hold_until=until)
    return failing


def _seconds(interval: timedelta) -> str:
    return f"{interval.total_seconds():g} s"
