"""A custom tool run as onceflow runs it: arguments validated, ids persisted before the
step finishes, earlier successes replayed, and every ending classified."""

import asyncio
from dataclasses import replace
from datetime import timedelta

import psycopg

from onceflow.storage import build_pool
from onceflow.tools import NothingSent, OutcomeClass, Tool, ToolAttemptResult, ToolCall
from onceflow.tools.worker import ToolCallInput, tool_activities
from tests.harness import attempt_environment, eventually
from tests.tools import sample_tools


def attempt(arguments: dict[str, object], *, number: int = 1, step_id: str = "s1") -> ToolCallInput:
    return ToolCallInput(
        tenant="acme",
        principal="agent",
        workflow_id="wf-custom",
        step_id=step_id,
        tool="write_note",
        arguments=arguments,
        attempt=number,
        policy=sample_tools.CONTRACT.policy(),
    )


async def test_a_repeat_replays_the_recorded_success_with_its_correlation_ids(
    database: str,
) -> None:
    async with build_pool(database) as pool:
        [perform] = tool_activities(sample_tools.SOUND, pool, None)
        env = attempt_environment()
        first = await env.run(perform, attempt({"text": "hello"}))
        repeat = await env.run(perform, attempt({"text": "hello"}, number=2))

    assert first.outcome is repeat.outcome is OutcomeClass.SUCCEEDED
    assert (first.resource_id, repeat.resource_id) == ("note-s1", "note-s1")
    assert first.evidence["request_id"] == "req-1"
    assert first.evidence["write_key_digest"].startswith("sha256:")
    assert repeat.evidence["found_by"] == "local_record"
    with psycopg.connect(database) as conn:
        rows = conn.execute(
            "SELECT tool, child_op, state, resource_id, correlation FROM operations"
        ).fetchall()
    assert rows == [("write_note", "write", "succeeded", "note-s1", {"request_id": "req-1"})]


async def test_bad_arguments_are_rejected_before_the_tool_runs(database: str) -> None:
    async with build_pool(database) as pool:
        [perform] = tool_activities(sample_tools.SOUND, pool, None)
        result = await attempt_environment().run(perform, attempt({"txt": "typo"}))
    assert result.outcome is OutcomeClass.REJECTED
    assert result.reason == "invalid arguments: text: Field required"
    with psycopg.connect(database) as conn:
        assert conn.execute("SELECT count(*) FROM operations").fetchone() == (0,)


async def test_an_exception_is_unknown_and_nothing_sent_is_transient(database: str) -> None:
    async def crash_after_sending(call: ToolCall[sample_tools.Note]) -> ToolAttemptResult:
        operation = await call.begin("write", provider_account="notes")
        await operation.record(request_id="req-sent")
        raise KeyError("secret-looking-body")

    async def refuse_before_sending(call: ToolCall[sample_tools.Note]) -> ToolAttemptResult:
        raise NothingSent("the queue was full")

    crashing = Tool(contract=sample_tools.CONTRACT, perform=crash_after_sending)
    refusing = Tool(contract=sample_tools.CONTRACT, perform=refuse_before_sending)
    async with build_pool(database) as pool:
        env = attempt_environment()
        [crash] = tool_activities(crashing, pool, None)
        [refuse] = tool_activities(refusing, pool, None)
        crashed = await env.run(crash, attempt({"text": "x"}))
        # Another note: the same text would be the crashed step's intent, held while its
        # effect is in doubt, and refused before the tool ran.
        refused = await env.run(refuse, attempt({"text": "y"}, step_id="s2"))

    assert crashed.outcome is OutcomeClass.UNKNOWN
    assert crashed.reason == "write_note raised KeyError; the effect may have happened"
    assert "secret-looking-body" not in (crashed.reason or "")
    assert (refused.outcome, refused.reason) == (OutcomeClass.TRANSIENT, "the queue was full")
    with psycopg.connect(database) as conn:
        # The request id learnt before the crash is kept for the lookup and the operator.
        assert conn.execute("SELECT state, correlation FROM operations").fetchall() == [
            ("started", {"request_id": "req-sent"})
        ]


async def test_a_lookup_finds_the_recorded_operation_and_keep_alive_heartbeats(
    database: str,
) -> None:
    async def slow_write(call: ToolCall[sample_tools.Note]) -> ToolAttemptResult:
        operation = await call.begin("write", provider_account="notes")
        async with call.keep_alive(every=timedelta(milliseconds=20)):
            # The far side works until the attempt has heartbeated three times.
            await eventually(lambda: len(heartbeats) >= 3, what="three heartbeats meanwhile")
        await operation.record(ticket="t-1")
        return await operation.failed(OutcomeClass.UNKNOWN, "no answer")

    async def look_up(call: ToolCall[sample_tools.Note]) -> ToolAttemptResult:
        operation = await call.find("write", provider_account="notes")
        if "ticket" in operation.correlation:
            return await operation.succeeded(operation.correlation["ticket"], {"found": True})
        return ToolAttemptResult(outcome=OutcomeClass.UNKNOWN, reason="not found")

    contract = replace(sample_tools.CONTRACT, heartbeat_timeout=timedelta(seconds=1))
    tool = Tool(contract=contract, perform=slow_write, look_up=look_up)
    heartbeats: list[object] = []
    async with build_pool(database) as pool:
        env = attempt_environment()
        env.on_heartbeat = lambda *details: heartbeats.append(details)
        perform, run_look_up = tool_activities(tool, pool, None)
        unknown = await env.run(perform, attempt({"text": "x"}))
        found = await env.run(run_look_up, attempt({"text": "x"}, number=1))

    assert tool.registered_contract.lookup_activity == "look_up_write_note"
    assert len(heartbeats) >= 3
    assert unknown.outcome is OutcomeClass.UNKNOWN
    assert unknown.evidence["ticket"] == "t-1"
    assert (found.outcome, found.resource_id) == (OutcomeClass.SUCCEEDED, "t-1")


def leased_writer(writes: list[tuple[str, int]], hold: float, ttl: float = 0.6) -> Tool:
    """A tool that writes three times under the operation's fenced lease (of ``ttl``
    seconds), like a far side that records the token of every write."""

    async def write_under_lease(call: ToolCall[sample_tools.Note]) -> ToolAttemptResult:
        operation = await call.begin("write", provider_account="notes")
        if operation.earlier_success:
            return operation.earlier_success
        async with operation.fenced_lease(ttl=timedelta(seconds=ttl)) as lease:
            for _ in range(3):
                writes.append((call.args.text, lease.token))
                await asyncio.sleep(hold / 3)  # scenario: each write takes a while
        return await operation.failed(OutcomeClass.UNKNOWN, "left for the next attempt")

    contract = replace(sample_tools.CONTRACT, heartbeat_timeout=timedelta(seconds=2))
    return Tool(contract=contract, perform=write_under_lease)


async def test_a_fenced_lease_lets_one_attempt_work_at_a_time(database: str) -> None:
    writes: list[tuple[str, int]] = []
    async with build_pool(database) as pool:
        # A lease far longer than the work (kept every 0.67 s): the second attempt waits for
        # the first to release it, even when a loaded core delays the first's writes.
        [perform] = tool_activities(leased_writer(writes, hold=0.6, ttl=5), pool, None)
        first = asyncio.create_task(attempt_environment().run(perform, attempt({"text": "a"})))
        await eventually(lambda: writes, what="the first attempt writes under its lease")
        second = await attempt_environment().run(perform, attempt({"text": "b"}, number=2))
        await first

    assert second.outcome is OutcomeClass.UNKNOWN
    # The second attempt waited for the first to release, then worked under a newer token.
    assert writes == [("a", 1), ("a", 1), ("a", 1), ("b", 2), ("b", 2), ("b", 2)]


async def test_a_stalled_holder_is_fenced_out_and_stopped(database: str) -> None:
    writes: list[tuple[str, int]] = []
    async with build_pool(database) as pool:
        [perform] = tool_activities(leased_writer(writes, hold=3.0), pool, None)
        stalled = asyncio.create_task(attempt_environment().run(perform, attempt({"text": "a"})))
        await eventually(lambda: writes, what="the holder writes under its lease")
        async with pool.connection() as conn:  # the holder's lease lapses (a long GC pause)
            await conn.execute("UPDATE operations SET lease_expires_at = now()")
        taken_over = await attempt_environment().run(perform, attempt({"text": "b"}, number=2))
        fenced_out = await stalled

    assert fenced_out.outcome is OutcomeClass.UNKNOWN
    assert fenced_out.reason == "write_note raised LeaseLost; the effect may have happened"
    assert taken_over.outcome is OutcomeClass.UNKNOWN
    assert ("b", 2) in writes
    # After the take-over the stalled attempt wrote nothing more with its old token.
    assert writes.index(("b", 2)) > max(i for i, write in enumerate(writes) if write[1] == 1)
    with psycopg.connect(database) as conn:
        assert conn.execute("SELECT fencing_token, lease_owner FROM operations").fetchone() == (
            2,
            None,
        )
