"""The tool API for effects in onceflow's own database, as a tool author uses it: a local
write under a fenced lease, and reading what an earlier step of the task recorded."""

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from onceflow.storage import build_pool
from onceflow.tools import OutcomeClass, Tool, ToolAttemptResult, ToolCall
from onceflow.tools.worker import ToolCallInput, tool_activities
from tests.harness import attempt_environment
from tests.tools import sample_tools


def attempt(*, step_id: str = "s1", number: int = 1) -> ToolCallInput:
    return ToolCallInput(
        tenant="acme",
        principal="agent",
        workflow_id="wf-local",
        step_id=step_id,
        tool="write_note",
        arguments={"text": f"note of {step_id}"},  # each step its own intent
        attempt=number,
        policy=sample_tools.CONTRACT.policy(),
    )


@pytest.fixture
def shelf(database: str) -> Iterator[str]:
    """A table of the tool's own, as a tool author would keep its business rows."""
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS note_shelf (note text PRIMARY KEY)")
        conn.execute("TRUNCATE note_shelf")
    yield database


def notes(database: str) -> list[str]:
    with psycopg.connect(database) as conn:
        return [row[0] for row in conn.execute("SELECT note FROM note_shelf ORDER BY note")]


async def test_a_fenced_write_commits_only_while_the_lease_holds(shelf: str) -> None:
    async def write_twice(call: ToolCall[sample_tools.Note]) -> ToolAttemptResult:
        operation = await call.begin("write", provider_account="notes")
        async with operation.fenced_lease() as lease:
            async with operation.fenced_transaction(lease) as conn:
                await conn.execute("INSERT INTO note_shelf VALUES ('first')")
            # Another attempt takes the operation over (as after this one's lease lapsed).
            async with call.pool.connection() as conn:
                await conn.execute("UPDATE operations SET fencing_token = fencing_token + 1")
            async with operation.fenced_transaction(lease) as conn:
                await conn.execute("INSERT INTO note_shelf VALUES ('second')")
        return await operation.failed(OutcomeClass.UNKNOWN, "unreachable")

    async with build_pool(shelf) as pool:
        [perform] = tool_activities(
            Tool(contract=sample_tools.CONTRACT, perform=write_twice), pool, None
        )
        fenced_out = await attempt_environment().run(perform, attempt())

    assert fenced_out.outcome is OutcomeClass.UNKNOWN
    assert fenced_out.reason == "write_note raised LeaseLost; the effect may have happened"
    assert notes(shelf) == ["first"]
    with psycopg.connect(shelf) as conn:
        # The stale holder did not release the newer holder's lease on its way out.
        assert conn.execute(
            "SELECT fencing_token, lease_owner IS NOT NULL FROM operations"
        ).fetchone() == (2, True)


async def test_a_local_effect_and_its_success_commit_together_and_a_later_step_reads_it(
    shelf: str,
) -> None:
    async def shelve(call: ToolCall[sample_tools.Note]) -> ToolAttemptResult:
        operation = await call.begin("write", provider_account="notes")
        if operation.earlier_success:
            return operation.earlier_success
        if call.step_id == "s2":
            earlier = await call.find("write", provider_account="notes", step_id="s1")
            with pytest.raises(RuntimeError, match="read-only"):
                await earlier.record(note="not ours to write")
            return await operation.succeeded(f"after-{earlier.resource_id}")

        async def put_on_shelf(conn: AsyncConnection[Any]) -> None:
            await conn.execute("INSERT INTO note_shelf VALUES (%s)", (call.step_id,))

        return await operation.commit_local_effect(put_on_shelf, f"note-{call.step_id}", {})

    tool = Tool(contract=sample_tools.CONTRACT, perform=shelve)
    async with build_pool(shelf) as pool:
        [perform] = tool_activities(tool, pool, None)
        env = attempt_environment()
        first = await env.run(perform, attempt())
        repeat = await env.run(perform, attempt(number=2))
        later_step = await env.run(perform, attempt(step_id="s2"))

    assert (first.outcome, first.resource_id) == (OutcomeClass.SUCCEEDED, "note-s1")
    assert repeat.resource_id == "note-s1" and repeat.evidence["found_by"] == "local_record"
    assert later_step.resource_id == "after-note-s1"
    assert notes(shelf) == ["s1"]
