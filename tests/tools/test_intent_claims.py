"""The intents' record on its own against PostgreSQL: of concurrent claims of one intent
exactly one takes it; a holder's own next attempt keeps it and remembers an effect in
doubt; a settled intent past its window is taken over and pruned, one in doubt never."""

import asyncio
from datetime import timedelta

import psycopg

from onceflow.storage import build_pool
from onceflow.tools._intent import IntentState
from onceflow.tools._intent_claims import IntentKey, claim_intent, settle_intent
from onceflow.tools.worker import prune_intents

DIGEST = "sha256:" + "a" * 64


def key(step: str, digest: str = DIGEST) -> IntentKey:
    return IntentKey(
        tenant="acme", tool="charge", digest=digest, workflow_id=f"wf-{step}", step_id="s"
    )


async def test_of_concurrent_claims_of_one_intent_exactly_one_takes_it(database: str) -> None:
    async with build_pool(database, max_size=8) as pool:

        async def claim(step: str) -> bool:
            async with pool.connection() as conn:
                return await claim_intent(conn, key(step), timedelta(hours=1)) is None

        taken = await asyncio.gather(*(claim(str(n)) for n in range(16)))
    assert taken.count(True) == 1


async def test_a_holder_keeps_its_intent_and_its_doubt_and_others_wait_or_take_it(
    database: str,
) -> None:
    window = timedelta(hours=1)
    async with build_pool(database, max_size=2) as pool, pool.connection() as conn:
        assert await claim_intent(conn, key("a"), window) is None
        await settle_intent(conn, key("a"), IntentState.UNKNOWN)
        held = await claim_intent(conn, key("b"), window)
        assert held is not None and (held.workflow_id, held.state) == ("wf-a", IntentState.UNKNOWN)
        # Its own retry keeps it; a later attempt without effect cannot clear the doubt.
        assert await claim_intent(conn, key("a"), window) is None
        await settle_intent(conn, key("a"), IntentState.NO_EFFECT)
        held = await claim_intent(conn, key("b"), window)
        assert held is not None and held.state is IntentState.UNKNOWN

        # Another intent: all its attempts without effect frees it for the next call.
        other = "sha256:" + "b" * 64
        assert await claim_intent(conn, key("c", other), window) is None
        await settle_intent(conn, key("c", other), IntentState.NO_EFFECT)
        assert await claim_intent(conn, key("d", other), window) is None
        await settle_intent(
            conn, key("d", other), IntentState.SUCCEEDED, resource_id="pi_1", result={"x": 1}
        )
        held = await claim_intent(conn, key("e", other), window)
        assert held is not None and (held.state, held.resource_id) == (
            IntentState.SUCCEEDED,
            "pi_1",
        )
        await conn.commit()


async def test_past_its_window_a_settled_intent_is_taken_over_and_pruned_one_in_doubt_never(
    database: str,
) -> None:
    settled, doubtful = "sha256:" + "c" * 64, "sha256:" + "d" * 64
    async with build_pool(database, max_size=2) as pool:
        async with pool.connection() as conn:
            for digest, state in (
                (settled, IntentState.SUCCEEDED),
                (doubtful, IntentState.UNKNOWN),
            ):
                assert await claim_intent(conn, key("a", digest), timedelta(hours=1)) is None
                await settle_intent(conn, key("a", digest), state)
            await conn.commit()
        with psycopg.connect(database, autocommit=True) as raw:
            raw.execute("UPDATE intents SET expires_at = now() - interval '1 second'")
        async with pool.connection() as conn:
            assert await claim_intent(conn, key("b", settled), timedelta(hours=1)) is None
            await settle_intent(conn, key("b", settled), IntentState.NO_EFFECT)
            held = await claim_intent(conn, key("b", doubtful), timedelta(hours=1))
            assert held is not None and held.workflow_id == "wf-a"
            await conn.commit()
        with psycopg.connect(database, autocommit=True) as raw:
            raw.execute("UPDATE intents SET expires_at = now() - interval '1 second'")
        assert await prune_intents(pool) == 1
    with psycopg.connect(database) as raw:
        left = raw.execute("SELECT intent_digest, state FROM intents").fetchall()
    assert left == [(doubtful, "unknown")]
