"""A principal's quota of new idempotency keys per window, counted on the records.

Each new key's record takes one of the quota's slots in the principal's window, and a
unique index lets one record hold each slot (migration 17): the claim writes one row,
and the database admits exactly ``quota`` new keys per window under concurrency. These
tests hold it to what a caller and an operator can see in the tables: exactly the quota
of records, each in its own slot, the rest refused with nothing written; a duplicate
storm and replays never count; a released claim frees its slot; a pruned record's window
has passed; and the previous release's gateways, which call the same function during a
rolling upgrade, are held to the same quota.
"""

import ast
import asyncio
import tarfile
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from onceflow.gateway import PrincipalStore, QuotaExceeded, request_fingerprint
from onceflow.gateway._principals import Principal
from onceflow.idempotency import (
    AlreadyClaimed,
    Claimed,
    IdempotencyStore,
    NewClaim,
    RecordState,
)
from onceflow.storage import build_pool
from onceflow.tools.worker import derive_task_workflow_id
from tests.gateway.conftest import execute, rows
from tests.harness import eventually
from tests.upgrade.release_archive import PACKAGE, archive_path, previous_release

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


def _claim(
    principal: Principal,
    key: str,
    quota: int,
    *,
    result_retention: timedelta = timedelta(days=1),
) -> NewClaim:
    scope = f"quota:{principal.name}:issue_coupon:call"
    return NewClaim(
        scope=scope,
        idempotency_key=key,
        request_hash=FINGERPRINT,
        tenant="quota",
        principal_id=principal.principal_id,
        workflow_id=derive_task_workflow_id(tenant="quota", scope=scope, idempotency_key=key),
        lease=timedelta(seconds=30),
        result_retention=result_retention,
        key_quota=quota,
        quota_window_seconds=WINDOW_SECONDS,
    )


async def _outcome(store: IdempotencyStore, claim: NewClaim) -> str:
    try:
        return type(await store.claim(claim)).__name__
    except QuotaExceeded:
        return "QuotaExceeded"


def _slots(database: str, principal: Principal) -> dict[str, tuple[Any, int | None]]:
    """Each of the principal's records: key -> (its window's end, its slot)."""
    return {
        key: (window_ends_at, slot)
        for key, window_ends_at, slot in rows(
            database,
            "SELECT idempotency_key, quota_window_ends_at, quota_slot FROM idempotency_records"
            " WHERE principal_id = %s",
            principal.principal_id,
        )
    }


def _shard_counts(database: str) -> int:
    return int(rows(database, "SELECT count(*) FROM principal_key_usage_shards")[0][0])


@pytest.mark.parametrize(("quota", "claims"), [(3, 27), (25, 40)])
async def test_concurrent_new_keys_of_one_principal_get_exactly_its_quota(
    database: str, pool: AsyncConnectionPool, quota: int, claims: int
) -> None:
    principal = await _principal(pool)
    store = IdempotencyStore(pool)

    outcomes = await asyncio.gather(
        *(_outcome(store, _claim(principal, f"k-{n}", quota)) for n in range(claims))
    )

    assert outcomes.count("Claimed") == quota
    assert outcomes.count("QuotaExceeded") == claims - quota
    slots = _slots(database, principal)
    claimed = [f"k-{n}" for n, outcome in enumerate(outcomes) if outcome == "Claimed"]
    # Exactly the admitted keys hold records: one each, every slot of the window once.
    assert sorted(slots) == sorted(claimed)
    assert sorted(slot for _, slot in slots.values()) == list(range(quota))
    assert len({window for window, _ in slots.values()}) == 1
    # The count is the records: no second row per claim.
    assert _shard_counts(database) == 0


async def test_a_duplicate_storm_on_one_key_counts_once_and_replays_never(
    database: str, pool: AsyncConnectionPool
) -> None:
    principal = await _principal(pool)
    store = IdempotencyStore(pool)
    claim = _claim(principal, "storm", quota=2)

    storm = await asyncio.gather(*(store.claim(claim) for _ in range(30)))
    replays = [await store.claim(claim) for _ in range(3)]
    # The storm took one of two slots: another key still gets the second.
    other = await store.claim(_claim(principal, "other", quota=2))

    assert sum(isinstance(outcome, Claimed) for outcome in storm) == 1
    assert sum(isinstance(outcome, AlreadyClaimed) for outcome in storm) == 29
    assert all(isinstance(replay, AlreadyClaimed) for replay in replays)
    assert isinstance(other, Claimed)
    assert sorted(slot for _, slot in _slots(database, principal).values()) == [0, 1]


async def test_a_spent_quota_refuses_new_keys_and_still_replays_the_admitted_ones(
    database: str, pool: AsyncConnectionPool
) -> None:
    principal = await _principal(pool)
    store = IdempotencyStore(pool)
    first, second = (_claim(principal, key, quota=2) for key in ("first", "second"))
    assert isinstance(await store.claim(first), Claimed)
    assert isinstance(await store.claim(second), Claimed)
    before = _slots(database, principal)

    with pytest.raises(QuotaExceeded) as refused:
        await store.claim(_claim(principal, "third", quota=2))
    replayed = await store.claim(first)

    assert 1 <= refused.value.retry_after_seconds <= WINDOW_SECONDS
    assert await store.get(first.scope, "third") is None
    assert isinstance(replayed, AlreadyClaimed)
    assert replayed.record.owner_token is not None
    # The refusal wrote nothing, the replay changed nothing.
    assert _slots(database, principal) == before


_CLAIM_HELD = """
    SELECT claimed FROM claim_idempotency_key(%s, %s, %s, 'owner', '30 s', 'quota',
        %s, %s, '1 day', %s, %s)
"""
"""A claim as the gateway makes it, for a connection that keeps it uncommitted."""
_QUOTA = 1000


def _held_arguments(principal: Principal, key: str) -> tuple[object, ...]:
    claim = _claim(principal, key, _QUOTA)
    return (
        claim.scope,
        key,
        FINGERPRINT,
        principal.principal_id,
        claim.workflow_id,
        _QUOTA,
        WINDOW_SECONDS,
    )


def _first_slots(database: str, principal: Principal, keys: list[str]) -> dict[str, int]:
    """The slot ``claim_idempotency_key`` tries first for each key (migration 17)."""
    workflow_ids = [_claim(principal, key, _QUOTA).workflow_id for key in keys]
    slots = rows(
        database,
        "SELECT (hashtext(id) & 2147483647) %% %s FROM unnest(%s::text[]) WITH ORDINALITY"
        " AS ids (id, n) ORDER BY n",
        _QUOTA,
        workflow_ids,
    )
    return {key: int(slot) for key, (slot,) in zip(keys, slots, strict=True)}


async def test_a_claim_never_waits_for_uncommitted_claims_of_other_slots(
    database: str, pool: AsyncConnectionPool
) -> None:
    """The regression test of the single quota row, whose lock made every claim of a
    principal wait for the one before it: eight claims of one principal stay
    uncommitted, while a ninth whose key hashes to another slot must not wait for any
    lock (a wait would end in ``lock_timeout``'s error, not in a slower answer)."""
    principal = await _principal(pool)
    # Nine keys of nine different first slots: two held claims of one slot would make the
    # second wait for the first, which this test holds uncommitted.
    by_slot: dict[int, str] = {}
    for key, slot in _first_slots(database, principal, [f"k-{n}" for n in range(100)]).items():
        by_slot.setdefault(slot, key)
    *held_keys, free_key = list(by_slot.values())[:9]

    held = [await psycopg.AsyncConnection.connect(database) for _ in held_keys]
    try:
        for conn, key in zip(held, held_keys, strict=True):
            # A wait would be this test's own mistake: fail at once rather than hang.
            await conn.execute("SET lock_timeout = '5s'")
            row = await (
                await conn.execute(_CLAIM_HELD, _held_arguments(principal, key))
            ).fetchone()
            assert row == (True,)
        async with await psycopg.AsyncConnection.connect(database, autocommit=True) as free:
            await free.execute("SET lock_timeout = '5s'")
            cursor = await free.execute(_CLAIM_HELD, _held_arguments(principal, free_key))
            row = await cursor.fetchone()
    finally:
        for conn in held:
            await conn.rollback()
            await conn.close()

    assert row == (True,)
    assert list(_slots(database, principal)) == [free_key]


async def test_a_claim_of_an_uncommitted_claims_slot_waits_for_it_then_takes_the_next(
    database: str, pool: AsyncConnectionPool
) -> None:
    """Two claims that hash to one slot at once: the later one waits for the earlier one's
    commit (a claim commits as soon as it wrote its record) and then counts in the next
    free slot."""
    principal = await _principal(pool)
    held_key = "held"
    slot = _first_slots(database, principal, [held_key])[held_key]
    candidates = _first_slots(database, principal, [f"same-{n}" for n in range(20_000)])
    same_slot_key = next(key for key, first in candidates.items() if first == slot)

    held = await psycopg.AsyncConnection.connect(database)
    try:
        row = await (
            await held.execute(_CLAIM_HELD, _held_arguments(principal, held_key))
        ).fetchone()
        assert row == (True,)
        waiting = asyncio.create_task(
            IdempotencyStore(pool).claim(_claim(principal, same_slot_key, _QUOTA))
        )
        await eventually(
            lambda: rows(
                database,
                "SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted",
            )[0][0],
            what="the second claim waits for the first one's commit",
        )
        assert not waiting.done()
        await held.commit()
        assert isinstance(await waiting, Claimed)
    finally:
        await held.rollback()
        await held.close()

    assert {key: taken for key, (_, taken) in _slots(database, principal).items()} == {
        held_key: slot,
        same_slot_key: (slot + 1) % _QUOTA,
    }


async def test_a_released_claim_frees_its_slot(database: str, pool: AsyncConnectionPool) -> None:
    """A claim released because its owner started nothing reserved nothing that ran: its
    record goes, and its slot with it, so the window's quota counts the records that
    stay (every task started under a key)."""
    principal = await _principal(pool)
    store = IdempotencyStore(pool)
    kept = await store.claim(_claim(principal, "kept", quota=2))
    released = await store.claim(_claim(principal, "released", quota=2))
    assert isinstance(kept, Claimed) and isinstance(released, Claimed)

    assert await store.release(released.record)
    after_release = await store.claim(_claim(principal, "after-release", quota=2))
    with pytest.raises(QuotaExceeded):
        await store.claim(_claim(principal, "over", quota=2))

    assert isinstance(after_release, Claimed)
    assert sorted(_slots(database, principal)) == ["after-release", "kept"]


async def test_a_record_is_pruned_only_once_its_quota_window_has_passed(
    database: str, pool: AsyncConnectionPool
) -> None:
    """A result retention shorter than the quota window must not hand a pruned record's
    slot to another key of the same window."""
    principal = await _principal(pool)
    store = IdempotencyStore(pool)
    short = timedelta(milliseconds=1)
    claimed = await store.claim(_claim(principal, "done", quota=1, result_retention=short))
    assert isinstance(claimed, Claimed)
    assert await store.complete(
        claimed.record,
        state=RecordState.SUCCEEDED,
        status_code=200,
        response_body={"ok": True},
        resource_id=None,
    )
    await eventually(
        lambda: rows(
            database,
            "SELECT result_expires_at <= statement_timestamp() FROM idempotency_records",
        )[0][0],
        what="the record's result retention passes",
    )

    kept = await store.prune()
    with pytest.raises(QuotaExceeded):
        await store.claim(_claim(principal, "same-window", quota=1))
    # The window ends (moved, as time would move it).
    execute(
        database,
        "UPDATE idempotency_records SET quota_window_ends_at = now() - interval '1 s'"
        " WHERE principal_id = %s",
        principal.principal_id,
    )
    pruned = await store.prune()

    assert kept.records == 0
    assert pruned.records == 1
    assert _slots(database, principal) == {}


async def test_the_records_of_a_passed_window_hold_no_slot_of_the_current_one(
    database: str, pool: AsyncConnectionPool
) -> None:
    principal = await _principal(pool)
    store = IdempotencyStore(pool)
    for key in ("a", "b"):
        assert isinstance(await store.claim(_claim(principal, key, quota=2)), Claimed)
    execute(
        database,
        "UPDATE idempotency_records SET quota_window_ends_at = quota_window_ends_at"
        " - make_interval(secs => %s) WHERE principal_id = %s",
        WINDOW_SECONDS,
        principal.principal_id,
    )

    outcomes = [await _outcome(store, _claim(principal, key, quota=2)) for key in "cde"]

    assert outcomes == ["Claimed", "Claimed", "QuotaExceeded"]
    windows = sorted(window for window, _ in _slots(database, principal).values())
    assert windows[0] == windows[1] < windows[2] == windows[3]


async def test_the_previous_releases_claim_statement_is_held_to_the_same_quota(
    database: str, pool: AsyncConnectionPool
) -> None:
    """A rolling upgrade: gateways of the previous release call ``claim_idempotency_key``
    with their own statement (read from the release's archive) after this release's
    migration replaced the function; they claim, replay and are refused over quota
    exactly as this release's gateways are, each key in a slot."""
    release = previous_release()
    with tarfile.open(archive_path(release)) as archive:
        store_file = archive.extractfile(f"{PACKAGE}/idempotency/_store.py")
        assert store_file is not None
        module = ast.parse(store_file.read())
    constants = {
        target.id: node.value.value
        for node in module.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    statement, quota_spent = constants["_CLAIM"], constants["_QUOTA_SPENT"]
    principal = await _principal(pool)

    async def old_claim(key: str) -> dict[str, Any] | None:
        new = _claim(principal, key, quota=2)
        async with await psycopg.AsyncConnection.connect(database, autocommit=True) as conn:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(
                statement,
                # The parameters 0.4.0's IdempotencyStore.claim passed, as it named them.
                {
                    "scope": new.scope,
                    "idempotency_key": key,
                    "request_hash": new.request_hash,
                    "owner_token": uuid.uuid4().hex,
                    "lease": new.lease,
                    "tenant": new.tenant,
                    "principal_id": new.principal_id,
                    "workflow_id": new.workflow_id,
                    "result_retention": new.result_retention,
                    "quota": new.key_quota,
                    "window": new.quota_window_seconds,
                },
            )
            return await cursor.fetchone()

    first = await old_claim("old-1")
    replay = await old_claim("old-1")
    mixed = await IdempotencyStore(pool).claim(_claim(principal, "new-1", quota=2))
    with pytest.raises(psycopg.errors.DatabaseError) as refused:
        await old_claim("old-2")

    assert first is not None and first["claimed"] is True
    assert replay is not None and replay["claimed"] is False
    assert replay["owner_token"] == first["owner_token"]
    assert isinstance(mixed, Claimed)
    assert refused.value.sqlstate == quota_spent
    assert 1 <= int(refused.value.diag.message_detail or 0) <= WINDOW_SECONDS
    assert sorted(slot for _, slot in _slots(database, principal).values()) == [0, 1]


async def test_pruning_deletes_old_windows_of_both_former_quota_tables(
    database: str, pool: AsyncConnectionPool
) -> None:
    principal = await _principal(pool)
    store = IdempotencyStore(pool)
    # Windows counted before migration 17: sharded, and one an older gateway counted in
    # principal_key_usage.
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
    assert _shard_counts(database) == 0
    assert rows(database, "SELECT count(*) FROM principal_key_usage")[0][0] == 0
