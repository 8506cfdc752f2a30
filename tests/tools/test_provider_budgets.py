"""The providers' budgets in PostgreSQL, shared by concurrent workers: no update is lost,
the bucket is never overdrawn, a pause holds every send and is audited."""

import asyncio
from datetime import timedelta

import psycopg

from onceflow.storage import build_pool
from onceflow.tools._provider import Answer, Provider
from onceflow.tools._provider_budgets import ask_to_send, tell_answer
from onceflow.tools.providers import (
    ProviderHealth,
    Send,
    pause_history,
    pause_provider,
    provider_states,
    resume_provider,
)


async def test_concurrent_retries_lose_no_update(database: str) -> None:
    provider = Provider(name="roomy", retry_tokens=1000)
    async with build_pool(database, max_size=8) as pool:
        asked = await asyncio.gather(*(ask_to_send(pool, provider, Send.RETRY) for _ in range(200)))
        assert all(a.admission.admitted for a in asked)
        [state] = await provider_states(pool)
    assert 800 <= state.row.tokens < 801  # plus what a 10 s interval refilled meanwhile


async def test_a_failing_provider_lets_no_more_retries_out_than_its_bucket(database: str) -> None:
    provider = Provider(name="stripe", retry_tokens=5, probe_every=timedelta(minutes=10))
    async with build_pool(database, max_size=8) as pool:
        await tell_answer(pool, provider, Send.FIRST, Answer.FAILED, None)
        # Eight "workers", 40 retries at once, each told as failed once it went out.

        async def retry() -> bool:
            asked = await ask_to_send(pool, provider, Send.RETRY)
            if asked.admission.admitted:
                await tell_answer(pool, provider, Send.RETRY, Answer.FAILED, asked.row)
            return asked.admission.admitted

        admitted = await asyncio.gather(*(retry() for _ in range(40)))
        assert admitted.count(True) == 5
        [state] = await provider_states(pool)
        assert state.health(provider) is ProviderHealth.SHEDDING_RETRIES
        held = await ask_to_send(pool, provider, Send.RETRY)
        assert not held.admission.admitted
        assert timedelta(minutes=9) < held.admission.recheck_in <= timedelta(minutes=10)
        # First attempts still go out; the first answer refills the bucket.
        first = await ask_to_send(pool, provider, Send.FIRST)
        assert first.admission.admitted
        await tell_answer(pool, provider, Send.FIRST, Answer.ANSWERED, first.row)
        [state] = await provider_states(pool)
    assert state.health(provider) is ProviderHealth.HEALTHY and state.row.tokens == 5


async def test_a_healthy_first_attempt_writes_nothing(database: str) -> None:
    provider = Provider(name="quiet")
    async with build_pool(database, max_size=2) as pool:
        asked = await ask_to_send(pool, provider, Send.FIRST)
        await tell_answer(pool, provider, Send.FIRST, Answer.ANSWERED, asked.row)
        assert await provider_states(pool) == []


async def test_a_pause_holds_every_send_until_resumed_and_is_audited(database: str) -> None:
    provider = Provider(name="stripe")
    async with build_pool(database, max_size=2) as pool:
        assert (
            await pause_provider(pool, provider, operator="ops@acme", reason="incident 42") is None
        )
        again = await pause_provider(pool, provider, operator="bob@acme", reason="me too")
        assert again is not None and again.by == "ops@acme"  # the pause in force, unchanged
        for send in Send:
            held = await ask_to_send(pool, provider, send)
            assert not held.admission.admitted
            assert held.admission.health is ProviderHealth.PAUSED
            assert "ops@acme" in held.admission.reason
        ended = await resume_provider(pool, provider, operator="ops@acme", reason="resolved")
        assert ended is not None and ended.reason == "incident 42"
        assert await resume_provider(pool, provider, operator="ops@acme", reason="x") is None
        assert (await ask_to_send(pool, provider, Send.RETRY)).admission.admitted
        history = await pause_history(pool, "stripe")
    assert [(r.action, r.operator, r.reason) for r in history] == [
        ("resume", "ops@acme", "resolved"),
        ("pause", "ops@acme", "incident 42"),
    ]
    async with await psycopg.AsyncConnection.connect(database) as conn:
        cursor = await conn.execute("SELECT count(*) FROM provider_pauses")
        assert await cursor.fetchone() == (2,)
