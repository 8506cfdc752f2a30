"""A fenced lease on one child operation, for long work that must never run twice at once.

The lease lives on the operation's record; every take-over raises its fencing token::

    started, free ──acquire──▶ held by A (token n) ──A's keeper extends it──▶ …
         ▲                          │ A dies or stalls: the lease expires
         └──────release─────────────┤
                                    └──acquire by B──▶ held by B (token n+1)

The far side must refuse writes carrying a token lower than the highest it has seen (that
is what makes a stalled A harmless); locally, A's keeper notices the newer token and
cancels A's block, which then raises ``LeaseLost`` (the attempt ends ``unknown``), and
A's writes to onceflow's own database go through ``fenced_transaction``, which refuses
them once the token is no longer the record's.
"""

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from temporalio import activity

from onceflow.tools._classify import NothingSent

_ACQUIRE = """
UPDATE operations
SET fencing_token = fencing_token + 1, lease_owner = %(owner)s,
    lease_expires_at = now() + %(ttl)s, updated_at = now()
WHERE child_key = %(child_key)s AND state = 'started'
  AND (lease_expires_at IS NULL OR lease_expires_at <= now())
RETURNING fencing_token
"""
_HOLDER = """
SELECT state, lease_owner, greatest(extract(epoch FROM lease_expires_at - now()), 0)
FROM operations WHERE child_key = %(child_key)s
"""
_EXTEND = """
UPDATE operations SET lease_expires_at = now() + %(ttl)s, updated_at = now()
WHERE child_key = %(child_key)s AND fencing_token = %(token)s AND lease_owner = %(owner)s
RETURNING fencing_token
"""
_RELEASE = """
UPDATE operations SET lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE child_key = %(child_key)s AND fencing_token = %(token)s AND lease_owner = %(owner)s
"""
# Locks the record until the caller's transaction ends, so a take-over (which updates the
# record) waits for a fenced write in flight instead of slipping in before its commit.
_FENCE = """
SELECT fencing_token FROM operations WHERE child_key = %(child_key)s FOR NO KEY UPDATE
"""
_CURRENT_TOKEN = "SELECT fencing_token FROM operations WHERE child_key = %(child_key)s"


class LeaseLost(Exception):
    """Another attempt took the lease over: this one must write nothing more.

    Args:
        token: This attempt's fencing token.
        current_token: The record's token now, when it could be read.
    """

    def __init__(self, token: int, current_token: int | None = None) -> None:
        now_at = "unknown" if current_token is None else str(current_token)
        super().__init__(f"fencing token {token} is stale (the operation is at token {now_at})")
        self.token = token
        """This attempt's fencing token."""
        self.current_token = current_token
        """The newer token that holds the operation now, if known."""


@dataclass
class Lease:
    """This attempt's hold on a child operation."""

    token: int
    """The fencing token: send it with every write so the far side can refuse stale ones."""
    owner: str
    """Who holds it (``<step>#<attempt>@<host>:<pid>``), as recorded and shown to operators."""
    lost: bool = False
    """Set when a newer token took over; the block is cancelled at the same time."""
    lost_to: int | None = None
    """With ``lost``: the token that took over, when it could be read."""
    progress: dict[str, Any] = field(default_factory=dict)
    """Sent with every heartbeat besides the token and owner: keep it up to date with how
    far the work got (a step name, a count), and the Temporal UI shows it on the attempt."""

    def heartbeat_details(self) -> dict[str, Any]:
        """What the keeper's heartbeats report: the token, the owner and ``progress``."""
        return {"fencing_token": self.token, "owner": self.owner, **self.progress}


def lease_owner(step_id: str, attempt: int) -> str:
    """The name a lease is held under: step, attempt, host and process."""
    return f"{step_id}#{attempt}@{socket.gethostname()}:{os.getpid()}"


@asynccontextmanager
async def hold_lease(
    pool: AsyncConnectionPool,
    child_key: str,
    *,
    ttl: timedelta,
    owner: str,
    keep_every: timedelta,
) -> AsyncIterator[Lease]:
    """Hold the operation's lease for the block, extending it and heartbeating meanwhile.

    Raises:
        NothingSent: Another attempt holds a live lease for two TTLs, or the operation is
            no longer in progress; nothing was sent by this attempt.
        LeaseLost: A newer token took over while the block ran.
    """
    params: dict[str, Any] = {"child_key": child_key, "owner": owner, "ttl": ttl}
    lease = Lease(token=await _acquire(pool, params, ttl), owner=owner)
    params["token"] = lease.token
    body = asyncio.current_task()
    keeper = asyncio.create_task(_keep(pool, params, keep_every, lease, body))
    try:
        yield lease
    except asyncio.CancelledError:
        if not lease.lost or body is None:
            raise
        body.uncancel()
        raise LeaseLost(lease.token, lease.lost_to) from None
    finally:
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)
        if not lease.lost:
            try:
                async with pool.connection() as conn:
                    await conn.execute(_RELEASE, params)
            except Exception:  # the lease then simply expires after its TTL
                activity.logger.warning("could not release the lease of %s", child_key[:12])


async def check_fence(conn: AsyncConnection[Any], child_key: str, lease: Lease) -> None:
    """In ``conn``'s transaction: go on only while ``lease`` still holds the operation.

    Raises:
        LeaseLost: A newer token holds it (``lease.lost`` is set too).
    """
    row = await (await conn.execute(_FENCE, {"child_key": child_key})).fetchone()
    current = int(row[0]) if row is not None else None
    if current != lease.token:
        lease.lost, lease.lost_to = True, current
        raise LeaseLost(lease.token, current)


async def _acquire(pool: AsyncConnectionPool, params: dict[str, Any], ttl: timedelta) -> int:
    loop = asyncio.get_running_loop()
    # A dead holder's lease is gone after one TTL; wait two, then let the workflow decide.
    deadline = loop.time() + 2 * ttl.total_seconds()
    while True:
        try:
            async with pool.connection() as conn:
                taken = await (await conn.execute(_ACQUIRE, params)).fetchone()
                holder = None if taken else await (await conn.execute(_HOLDER, params)).fetchone()
        except Exception as error:
            raise NothingSent(f"could not take the lease ({type(error).__name__})") from error
        if taken is not None:
            return int(taken[0])
        if holder is None or holder[0] != "started":
            raise NothingSent("the operation is no longer in progress; nothing was sent")
        if loop.time() >= deadline:
            raise NothingSent(f"the lease is held by {holder[1]}; nothing was sent")
        activity.heartbeat({"waiting_for_lease_held_by": holder[1]})
        await asyncio.sleep(min(float(holder[2]) + 0.05, ttl.total_seconds() / 3))


async def _keep(
    pool: AsyncConnectionPool,
    params: dict[str, Any],
    every: timedelta,
    lease: Lease,
    body: "asyncio.Task[Any] | None",
) -> None:
    while True:
        await asyncio.sleep(every.total_seconds())
        activity.heartbeat(lease.heartbeat_details())
        try:
            async with pool.connection() as conn:
                kept = await (await conn.execute(_EXTEND, params)).fetchone()
                current = (
                    None if kept else await (await conn.execute(_CURRENT_TOKEN, params)).fetchone()
                )
        except Exception:  # the lease may lapse; a newer holder then fences this one out
            continue
        if kept is None:
            lease.lost, lease.lost_to = True, int(current[0]) if current else None
            if body is not None:
                body.cancel()
            return
