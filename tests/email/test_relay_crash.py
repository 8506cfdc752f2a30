"""Three ``onceflow relay`` processes share the outbox; one is SIGKILLed mid-batch, in
the middle of a delivery the server has already applied. Every email is delivered and
the consumer (the sink) applied each event exactly once."""

import asyncio
import os
import signal
import subprocess
from collections.abc import Iterator

import psycopg
import pytest
from onceflow_devstack.smtp_sink import RunningSink, SinkFault
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.task_api import TaskClient
from onceflow.workflows.task_models import TaskState
from tests.harness import eventually, onceflow_command, spawn, stop, wait_for_line

from .conftest import deliveries, start_email, welcome_email

EMAILS = 9
HOLD_SECONDS = 0.4
"""The sink holds every final reply this long, so relays are caught mid-delivery."""


@pytest.fixture
def relays(sink: RunningSink, database: str) -> Iterator[list[subprocess.Popen[str]]]:
    """Three relay processes on the test's database, delivering to the test's sink."""
    environment = {
        "DATABASE_URL": database,
        "SMTP_URL": sink.smtp_url,
        "ONCEFLOW_EMAIL_SMTP_TIMEOUT": "PT3S",
        "ONCEFLOW_EMAIL_CLAIM_LEASE": "PT1.5S",
        "ONCEFLOW_EMAIL_POLL_INTERVAL": "PT0.1S",
        "ONCEFLOW_EMAIL_BATCH_SIZE": "3",
    }
    started = [spawn(onceflow_command("relay"), env=environment) for _ in range(3)]
    yield started
    for process in started:
        stop(process, timeout=10)


def sending_rows(database: str) -> list[tuple[str, str]]:
    """``(claimed_by, message_id)`` of every row a relay is delivering now."""
    with psycopg.connect(database) as conn:
        return conn.execute(
            "SELECT o.claimed_by, m.message_id FROM email_outbox o"
            " JOIN email_messages m USING (event_id) WHERE o.state = 'sending'"
        ).fetchall()


async def test_a_relay_killed_mid_batch_loses_no_email_and_duplicates_none(
    sink: RunningSink,
    relays: list[subprocess.Popen[str]],
    worker: Worker,
    tasks: TaskClient,
    dev_server: WorkflowEnvironment,
    database: str,
) -> None:
    await asyncio.gather(
        *(asyncio.to_thread(wait_for_line, relay, "onceflow relay") for relay in relays)
    )
    sink.sink.add_fault(SinkFault.DELAY_REPLY, times=None, delay_seconds=HOLD_SECONDS)
    workflow_ids = await asyncio.gather(
        *(start_email(tasks, welcome_email(n)) for n in range(EMAILS))
    )

    # The victim: a relay holding several claims, one of them a message the sink has
    # applied and whose reply it is holding (the relay dies between effect and record).
    by_pid = {f"-{relay.pid}": relay for relay in relays}

    def caught_mid_batch() -> tuple[subprocess.Popen[str], str, list[tuple[str, str]]] | None:
        rows = sending_rows(database)
        for claimed_by, message_id in rows:
            holders = [row for row in rows if row[0] == claimed_by]
            pid = next((p for p in by_pid if claimed_by.endswith(p)), None)
            if pid and len(holders) >= 2 and message_id in sink.sink.holding:
                return by_pid[pid], message_id, rows
        return None

    victim, in_flight, rows = await eventually(
        caught_mid_batch,
        what="a relay is caught mid-batch, the sink holding its applied message's reply",
        timeout=8,
        interval=0.02,
    )
    victim_id = next(claimed for claimed, message in rows if message == in_flight)
    victim_claims = [message for claimed, message in rows if claimed == victim_id]
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()

    results = await asyncio.wait_for(
        asyncio.gather(*(tasks.result(workflow_id) for workflow_id in workflow_ids)), timeout=60
    )

    assert all(result.state is TaskState.SUCCEEDED for result in results)
    message_ids = [result.step("mail").resource_id or "" for result in results]
    assert len(set(message_ids)) == EMAILS
    # The consumer's record: each event applied exactly once, none missing.
    assert sorted(sink.sink.applied_ids()) == sorted(message_ids)
    assert all(sink.sink.applications(message_id) == 1 for message_id in message_ids)
    # The message in flight when the relay died was delivered again by another relay,
    # which took the expired claim over; the sink ignored the duplicate.
    assert sink.sink.deliveries(in_flight) == 2
    [killed, taken_over] = deliveries(database, in_flight)
    assert killed == (victim_id, False, None)  # started, never finished
    assert taken_over[1:] == (True, "delivered") and taken_over[0] != victim_id
    # The rest of the victim's batch went to the surviving relays.
    for message_id in victim_claims:
        assert deliveries(database, message_id)[-1][0] != victim_id
    with psycopg.connect(database) as conn:
        assert conn.execute(
            "SELECT state, count(*) FROM email_outbox GROUP BY state"
        ).fetchall() == [("delivered", EMAILS)]
