"""Keys of principals' quota windows that this gateway reserved ahead, spent in process.

A new key counts against its principal's quota of new keys per window. Counting each key
in the database is a second row write per claim; instead, when this process runs low on
a principal's keys, one claim reserves a block of them (``quota_block``) in its own
statement, and the process spends the spare ones on its next new keys of that principal,
which then count nothing in the database. One block at a time is being reserved per
principal; a claim that finds none spare meanwhile counts its own key alone.

The shards count reserved keys, so a window never admits more than its quota, whatever
the number of gateways. What a block gives up is the last keys of a window: spare keys a
gateway holds when the window ends (or when it stops) are lost to that window, fewer
than one and a half blocks per gateway and principal, each block at most a sixty-fourth
of the quota. A quota under 128 keys reserves no block and stays exact.

Only a claim the database answered spends or returns a key: a claim that conflicted (a
replay) gives its reserved key back; one whose statement failed keeps it spent, since
its insert may have committed (spending one key too few is the safe side).
"""

import uuid
from dataclasses import dataclass
from datetime import datetime

BLOCK_FRACTION = 64
"""A block is at most this fraction of the quota."""

MAX_BLOCK = 16
"""A block's largest size: one claim in 16 writes a shard."""


def quota_block(quota: int) -> int:
    """How many keys a reserving claim counts under ``quota`` (its own included)."""
    return max(1, min(MAX_BLOCK, quota // BLOCK_FRACTION))


@dataclass(frozen=True)
class QuotaPool:
    """Whose keys: one principal under one quota and window length."""

    principal_id: uuid.UUID
    quota: int
    window_seconds: int


@dataclass(frozen=True)
class KeyPlan:
    """How one claim meets the quota: with a key reserved in ``reserved_window``, or by
    counting ``count`` keys (its own and the spare ones it reserves)."""

    reserved_window: datetime | None
    count: int


class SpareKeys:
    """The spare keys this process reserved, per principal's quota and window."""

    def __init__(self) -> None:
        self._spare: dict[QuotaPool, tuple[datetime, int]] = {}
        self._reserving: set[QuotaPool] = set()

    def plan(self, pool: QuotaPool) -> KeyPlan:
        """What the next claim of ``pool`` does; end it with ``settle``."""
        block = quota_block(pool.quota)
        held = self.held(pool)
        if block > 1 and held <= block // 2 and pool not in self._reserving:
            # Reserve the next block while the spare keys last, so the claims meanwhile
            # still find some.
            self._reserving.add(pool)
            return KeyPlan(reserved_window=None, count=block)
        window = self._spend(pool)
        return KeyPlan(reserved_window=window, count=1)

    def settle(
        self, pool: QuotaPool, plan: KeyPlan, *, window: datetime | None, spare: int
    ) -> None:
        """End ``plan``: the database counted in ``window`` and reserved ``spare`` keys
        beyond the claim's own (``window`` None: no answer, nothing is returned)."""
        if plan.count > 1:
            self._reserving.discard(pool)
        if window is not None:
            self._add(pool, window, spare)

    def give_back(self, pool: QuotaPool, window: datetime) -> None:
        """A reserved key the claim did not spend (its key was taken: a replay)."""
        self._add(pool, window, 1)

    def spend_after_refusal(self, pool: QuotaPool) -> datetime | None:
        """A key another claim reserved while this one was refused, if any."""
        return self._spend(pool)

    def held(self, pool: QuotaPool) -> int:
        """How many spare keys of ``pool`` this process holds."""
        held = self._spare.get(pool)
        return held[1] if held is not None else 0

    def _spend(self, pool: QuotaPool) -> datetime | None:
        held = self._spare.get(pool)
        if held is None:
            return None
        window, count = held
        if count == 1:
            del self._spare[pool]
        else:
            self._spare[pool] = (window, count - 1)
        return window

    def _add(self, pool: QuotaPool, window: datetime, count: int) -> None:
        if count <= 0:
            return
        held = self._spare.get(pool)
        if held is not None and held[0] == window:
            count += held[1]
        elif held is not None and held[0] > window:
            return  # keys of a window that has passed are void
        self._spare[pool] = (window, count)
