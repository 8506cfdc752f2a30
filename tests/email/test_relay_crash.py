"""Three ``onceflow relay`` processes share the outbox; one is SIGKILLed mid-batch, in
the middle of a delivery the server has already applied. The relay that takes that claim
over does not send it again (it may have passed DATA, and SMTP has no idempotency): the
step parks and the sink received it once. The rest of the dead relay's batch, never
sent, is delivered by the survivors; every other email is delivered exactly once."""

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

from onceflow.retry_policy import OutcomeClass
from onceflow.task_api import TaskClient
from onceflow.workflows.task_models import (
    ReconcileDecision,
    ReconcileInput,
    TaskState,
    TaskStatus,
)
from tests.harness import (
    HANG_SECONDS,
    eventually,
    onceflow_command,
    spawn,
    stop,
    wait_for_line,
    workflow_idle,
)

from .conftest import (
    deliveries,
    outbox_row,
    relay_caught_up,
    start_email,
    wait_for,
    welcome_email,
)

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
        stop(process)


def sending_rows(database: str) -> list[tuple[str, str]]:
    """``(claimed_by, message_id)`` of every row a relay is delivering now."""
    with psycopg.connect(database) as conn:
        return conn.execute(
            "SELECT o.claimed_by, m.message_id FROM email_outbox o"
            " JOIN email_messages m USING (event_id) WHERE o.state = 'sending'"
        ).fetchall()


async def test_a_relay_killed_mid_batch_loses_no_email_and_resends_none(
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
        interval=0.02,
    )
    victim_id = next(claimed for claimed, message in rows if message == in_flight)
    victim_claims = [message for claimed, message in rows if claimed == victim_id]
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()

    def settled(status: TaskStatus) -> bool:
        return status.state in (TaskState.SUCCEEDED, TaskState.PARKED)

    statuses = await asyncio.gather(
        *(wait_for(tasks, workflow_id, settled) for workflow_id in workflow_ids)
    )

    message_ids = [status.step("mail").evidence["message_id"] for status in statuses]
    assert len(set(message_ids)) == EMAILS
    by_message = dict(zip(message_ids, zip(workflow_ids, statuses, strict=True), strict=True))
    parked_id, parked = by_message[in_flight]
    # The message in flight when the relay died parks: the relay that took the expired
    # claim over found it had begun sending and did not send it again.
    assert parked.state is TaskState.PARKED
    step = parked.step("mail")
    assert [attempt.outcome for attempt in step.attempts] == [OutcomeClass.UNKNOWN]
    assert f"relay {victim_id} held the claim" in (step.attempts[0].reason or "")
    assert "may have passed DATA" in (step.attempts[0].reason or "")
    assert step.evidence["outbox_state"] == "unknown"
    [killed] = deliveries(database, in_flight)
    assert killed[:2] == (victim_id, False) and killed[2] == "unknown"
    assert sink.sink.deliveries(in_flight) == 1  # the victim's, which the server applied
    # Every other email was delivered exactly once; the rest of the victim's batch,
    # never sent, by a surviving relay that took its claim over.
    others = [message_id for message_id in message_ids if message_id != in_flight]
    assert all(by_message[m][1].state is TaskState.SUCCEEDED for m in others)
    assert all(by_message[m][1].step("mail").resource_id == m for m in others)
    assert sorted(sink.sink.applied_ids()) == sorted(message_ids)
    assert all(sink.sink.deliveries(m) == 1 for m in message_ids)
    assert all(sink.sink.applications(m) == 1 for m in message_ids)
    for message_id in victim_claims:
        if message_id != in_flight:
            [survivor] = deliveries(database, message_id)
            assert survivor[0] != victim_id and survivor[1:] == (True, "delivered")
    with psycopg.connect(database) as conn:
        assert conn.execute(
            "SELECT state, count(*) FROM email_outbox GROUP BY state ORDER BY state"
        ).fetchall() == [("delivered", EMAILS - 1), ("unknown", 1)]

    # The operator finds it in the sink's record and says it happened: settled, unsent.
    await tasks.reconcile(
        parked_id,
        ReconcileInput(
            step_id="mail",
            decision=ReconcileDecision.HAPPENED,
            operator="ops-oncall",
            reason="the mail server applied it",
            resource_id=in_flight,
        ),
    )
    result = await asyncio.wait_for(tasks.result(parked_id), timeout=HANG_SECONDS)
    assert result.state is TaskState.SUCCEEDED
    assert result.step("mail").result == {"reconciled": True}
    await workflow_idle(dev_server.client, parked_id)
    await relay_caught_up(tasks, sink)
    assert sink.sink.deliveries(in_flight) == 1
    assert len(deliveries(database, in_flight)) == 1
    assert outbox_row(database, in_flight) == ("unknown", 1)  # never armed again
