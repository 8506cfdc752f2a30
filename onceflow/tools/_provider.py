"""The service a tool's sends reach, declared once by its family and shared by every task
and worker: its retry budget, how it is probed while it fails, its documented rate limit.

    first attempt ──▶ sent (unless the provider is paused or said "not now")
    retry         ──▶ takes a token; none left while the provider fails: the step waits
                      (a durable timer, off the task's clock) and one retry per
                      ``probe_every`` goes out as the probe
    success       ──▶ deposits ``retry_deposit``; a retry's success repays its token;
                      while the provider was failing it ends the failing and refills
    429 "not now" ──▶ every send waits until the provider's ``Retry-After`` (or
                      ``throttle_hold``) has passed

Pure data and pure policy: the rows live in PostgreSQL (``_provider_budgets``), the
workflow only reads each answer from an activity result.
"""

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True, kw_only=True)
class Provider:
    """A service several tools reach (Stripe for ``charge_payment`` and ``refund_payment``):
    one retry budget and one pause switch for all of them, fleet-wide.

    Example::

        LEDGERPAY = Provider(name="ledgerpay", requests_per_second=50)
        ToolContract(name="ledgerpay_charge", ..., provider=LEDGERPAY)

    Bound: while the provider answers nothing successfully, the retries the whole fleet
    sends to it are at most ``retry_tokens`` (what the bucket held when the failures
    began) plus one per ``probe_every``; first attempts are never held by the budget.
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
    """While the provider fails and the bucket is empty, one retry per this interval goes
    out, fleet-wide, to learn whether it answers again. Default 10 s."""
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
