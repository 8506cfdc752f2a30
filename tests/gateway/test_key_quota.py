"""A principal's quota of new idempotency keys per window, counted in shards.

The count is spread over up to 16 rows per principal and window so that concurrent
claims of one principal do not queue on one row lock; these tests prove the spreading
changes nothing a caller can see: exactly ``quota`` new keys per window under
concurrency (a quota smaller than the shard count included), a duplicate storm on one
key counts once, a replay never counts, an over-quota claim writes nothing.
"""

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from onceflow.gateway import PrincipalStore, QuotaExceeded, request_fingerprint
from onceflow.gateway._principals import Principal
from onceflow.idempotency import AlreadyClaimed, Claimed, IdempotencyStore, NewClaim
from onceflow.storage import build_pool
from onceflow.tools.worker import derive_task_workflow_id
from tests.gateway.conftest import execute, rows

SHARDS = 16
# Longer than any test runs, so all of a test's claims fall in one window.
WINDOW_SECONDS = 86_400
FINGERPRINT = request_fingerprint(operation="o", scope="s", route="r", body={})


@pytest.fixture
async def pool(database: str) -> AsyncIterator[AsyncConnectionPool]:
    async with build_pool(database, max_size=8) as pool:
        yield pool


async def _principal(pool: AsyncConnectionPool) -> Principal:
    principal, _ = await PrincipalStore(pool).create(
        tenant="quota", name=f"agent-{uuid.uuid4().hex[:8]}", tools=["issue_coupon"]
    )
    return principal


def _claim(principal: Principal, key: str, quota: int) -> NewClaim:
    scope = f"quota:{principal.name}:issue_coupon:call"
    return NewClaim(
        scope=scope,
        idempotency_key=key,
        request_hash=FINGERPRINT,
        tenant="quota",
        principal_id=principal.principal_id,
        workflow_id=derive_task_workflow_id(tenant="quota", scope=scope, idempotency_key=key),
        lease=timedelta(seconds=30),
        result_retention=timedelta(days=1),
        key_quota=quota,
        quota_window_seconds=WINDOW_SECONDS,
    )


async def _outcome(store: IdempotencyStore, claim: NewClaim) -> str:
    try:
        return type(await store.claim(claim)).__name__
    except QuotaExceeded:
        return "QuotaExceeded"


def _usage(database: str, principal: Principal) -> list[tuple[int, int]]:
    """``(shard, keys_claimed)`` of the principal's windows, in shard order."""
    return [
        (shard, keys)
        for shard, keys in rows(
            database,
            "SELECT shard, keys_claimed FROM principal_key_usage_shards"
            " WHERE principal_id = %s ORDER BY shard",
            principal.principal_id,
        )
    ]


def _records(database: str, principal: Principal) -> int:
    return int(
        rows(
            database,
            "SELECT count(*) FROM idempotency_records WHERE principal_id = %s",
            principal.principal_id,
        )[0][0]
    )


@pytest.mark.parametrize("quota", [3, 40])
async def test_concurrent_new_keys_of_one_principal_get_exactly_its_quota(
    database: str, pool: AsyncConnectionPool, quota: int
) -> None:
    principal = await _principal(pool)
    store = IdempotencyStore(pool)

    outcomes = await asyncio.gather(
        *(_outcome(store, _claim(principal, f"k-{n}", quota)) for n in range(quota + 24))
    )

    assert outcomes.count("Claimed") == quota
    assert outcomes.count("QuotaExceeded") == 24
    assert _records(database, principal) == quota
    usage = _usage(database, principal)
    assert sum(keys for _, keys in usage) == quota
    # Every shard holds at most its share: quota // 16, one more for the first quota % 16.
    assert all(keys <= quota // SHARDS + (shard < quota % SHARDS) for shard, keys in usage)


async def test_a_duplicate_storm_on_one_key_counts_once_and_replays_never(
    database: str, pool: AsyncConnectionPool
) -> None:
    principal = await _principal(pool)
    store = IdempotencyStore(pool)
    claim = _claim(principal, "storm", quota=1000)

    storm = await asyncio.gather(*(store.claim(claim) for _ in range(30)))
    replays = [await store.claim(claim) for _ in range(3)]

    assert sum(isinstance(outcome, Claimed) for outcome in storm) == 1
    assert sum(isinstance(outcome, AlreadyClaimed) for outcome in storm) == 29
    assert all(isinstance(replay, AlreadyClaimed) for replay in replays)
    assert _records(database, principal) == 1
    assert sum(keys for _, keys in _usage(database, principal)) == 1


async def test_a_claim_never_waits_for_uncommitted_claims_of_its_principal(
    database: str, pool: AsyncConnectionPool
) -> None:
    """The regression test of the single quota row: each new claim locked it until its
    commit, so a principal's claims waited for each other. Here eight claims of one
    principal stay uncommitted, holding their shards, while a ninth must not wait for
    any lock (a wait would end in ``lock_timeout``'s error, not in a slower answer)."""
    principal = await _principal(pool)
    claim = """
        SELECT claimed FROM claim_idempotency_key(%s, %s, %s, 'owner', '30 s', 'quota',
            %s, %s, '1 day', 1000, %s)
    """

    def arguments(key: str) -> tuple[object, ...]:
        scope = f"quota:{principal.name}:issue_coupon:call"
        workflow_id = derive_task_workflow_id(tenant="quota", scope=scope, idempotency_key=key)
        return (scope, key, FINGERPRINT, principal.principal_id, workflow_id, WINDOW_SECONDS)

    # The window's first claim creates its shards; committed, as every claim is at once.
    assert isinstance(await IdempotencyStore(pool).claim(_claim(principal, "first", 1000)), Claimed)
    held = [await psycopg.AsyncConnection.connect(database) for _ in range(8)]
    try:
        for number, conn in enumerate(held):
            row = await (await conn.execute(claim, arguments(f"held-{number}"))).fetchone()
            assert row == (True,)
        async with await psycopg.AsyncConnection.connect(database, autocommit=True) as free:
            await free.execute("SET lock_timeout = '5s'")
            row = await (await free.execute(claim, arguments("free"))).fetchone()
    finally:
        for conn in held:
            await conn.rollback()
            await conn.close()

    assert row == (True,)
    assert _records(database, principal) == 2
    assert sum(keys for _, keys in _usage(database, principal)) == 2


async def test_an_over_quota_key_reserves_nothing_and_earlier_keys_still_replay(
    database: str, pool: AsyncConnectionPool
) -> None:
    principal = await _principal(pool)
    store = IdempotencyStore(pool)
    first, second = (_claim(principal, key, quota=2) for key in ("first", "second"))
    assert isinstance(await store.claim(first), Claimed)
    assert isinstance(await store.claim(second), Claimed)

    with pytest.raises(QuotaExceeded) as refused:
        await store.claim(_claim(principal, "third", quota=2))
    replayed = await store.claim(first)

    assert refused.value.retry_after_seconds >= 1
    assert await store.get(first.scope, "third") is None
    assert isinstance(replayed, AlreadyClaimed)
    assert replayed.record.owner_token is not None
    assert _records(database, principal) == 2
    assert _usage(database, principal) == [(0, 1), (1, 1)]


async def test_pruning_deletes_old_windows_of_both_quota_tables(
    database: str, pool: AsyncConnectionPool
) -> None:
    principal = await _principal(pool)
    store = IdempotencyStore(pool)
    assert isinstance(await store.claim(_claim(principal, "current", quota=100)), Claimed)
    # An old sharded window, and one an older gateway counted in principal_key_usage.
    execute(
        database,
        "INSERT INTO principal_key_usage_shards"
        " SELECT %s, now() - interval '2 days', shard, 1 FROM generate_series(0, 15) shard",
        principal.principal_id,
    )
    execute(
        database,
        "INSERT INTO principal_key_usage VALUES (%s, now() - interval '3 days', 5)",
        principal.principal_id,
    )

    pruned = await store.prune()

    assert pruned.usage_windows == 2
    assert sum(keys for _, keys in _usage(database, principal)) == 1
    assert rows(database, "SELECT count(*) FROM principal_key_usage")[0][0] == 0
