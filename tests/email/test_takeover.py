"""A relay takes over a dead relay's expired claim and decides from what the dead claim
recorded: a delivery that began sending its message (it may have passed DATA) parks the
step and nothing is sent until an operator decides; a delivery that never began sending
is delivered by the relay that took it over, once.

The dead relay is the outbox's own API driven by the test up to the point where a relay
dies (claim, start the delivery, mark the message sent), so the moment of death is exact;
the relay that takes over is a real one delivering to the sink."""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

from onceflow_devstack.smtp_sink import RunningSink
from psycopg_pool import AsyncConnectionPool
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.email import Claim, EmailOutbox, EmailSettings, OutboxRelay
from onceflow.retry_policy import OutcomeClass
from onceflow.task_api import TaskClient
from onceflow.workflows.task_models import ReconcileDecision, ReconcileInput, TaskState
from tests.harness import HANG_SECONDS, eventually, workflow_idle

from .conftest import (
    deliveries,
    outbox_row,
    parked,
    relay_caught_up,
    start_email,
    wait_for,
    welcome_email,
)

DEAD = "relay-dead"
SHORT_LEASE = timedelta(milliseconds=300)


@contextlib.asynccontextmanager
async def running_relay(
    pool: AsyncConnectionPool, settings: EmailSettings
) -> AsyncIterator[OutboxRelay]:
    relay = OutboxRelay(pool, settings)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        yield relay
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=HANG_SECONDS)


async def dead_relay_claims(pool: AsyncConnectionPool) -> tuple[EmailOutbox, Claim, int]:
    """A relay claims the armed email and starts its delivery, then (as the test goes on)
    dies: its claim is left to expire."""
    outbox = EmailOutbox(pool)
    [claim] = await eventually(
        lambda: outbox.claim(relay_id=DEAD, lease=SHORT_LEASE, limit=1),
        what="the doomed relay claims the armed email",
    )
    delivery_id = await outbox.start_delivery(claim, relay_id=DEAD, lease=SHORT_LEASE)
    assert delivery_id is not None
    return outbox, claim, delivery_id


async def test_a_takeover_after_the_message_began_sending_parks_until_did_not_happen(
    dev_server: WorkflowEnvironment,
    sink: RunningSink,
    pool: AsyncConnectionPool,
    settings: EmailSettings,
    worker: Worker,
    tasks: TaskClient,
    database: str,
) -> None:
    workflow_id = await start_email(tasks, welcome_email())
    outbox, claim, delivery_id = await dead_relay_claims(pool)
    # Past the server's 354: the mark commits, then the relay dies with the message on
    # the wire (this server lost it, as the operator will find).
    assert await outbox.mark_message_sent(claim, delivery_id, lease=SHORT_LEASE)
    message_id = claim.message.message_id

    async with running_relay(pool, settings) as relay:
        status = await wait_for(tasks, workflow_id, parked)
        step = status.step("mail")
        assert [attempt.outcome for attempt in step.attempts] == [OutcomeClass.UNKNOWN]
        reason = step.attempts[0].reason or ""
        assert f"relay {DEAD} held the claim and began sending the message at" in reason
        assert "may have passed DATA" in reason and f"Relay {relay.relay_id} took" in reason
        assert step.evidence["outbox_state"] == "unknown"
        assert "the outbox row is unknown" in step.evidence["lookup"]

        await workflow_idle(dev_server.client, workflow_id)
        await relay_caught_up(tasks, sink)
        assert (await tasks.status(workflow_id)).state is TaskState.PARKED
        assert sink.sink.deliveries(message_id) == 0  # the takeover sent nothing
        assert deliveries(database, message_id) == [(DEAD, False, "unknown")]
        assert outbox_row(database, message_id) == ("unknown", 1)
        # The dead relay, were it only stalled, could not send under its lost claim.
        assert not await outbox.mark_message_sent(claim, delivery_id, lease=SHORT_LEASE)

        await tasks.reconcile(
            workflow_id,
            ReconcileInput(
                step_id="mail",
                decision=ReconcileDecision.DID_NOT_HAPPEN,
                operator="ops-oncall",
                reason="not in the recipient's mailbox",
                # The outbox cannot prove SMTP did not take it: the operator's word.
                unverified=True,
            ),
        )
        result = await asyncio.wait_for(tasks.result(workflow_id), timeout=HANG_SECONDS)
        await workflow_idle(dev_server.client, workflow_id)
        await relay_caught_up(tasks, sink)

        step = result.step("mail")
        assert result.state is TaskState.SUCCEEDED and step.resource_id == message_id
        assert [(a.outcome, a.operator_authorised) for a in step.attempts] == [
            (OutcomeClass.UNKNOWN, False),
            (OutcomeClass.SUCCEEDED, True),
        ]
        assert sink.sink.deliveries(message_id) == 1  # exactly one, authorised
        assert sink.sink.applications(message_id) == 1
        assert deliveries(database, message_id) == [
            (DEAD, False, "unknown"),
            (relay.relay_id, False, "delivered"),
        ]
        assert outbox_row(database, message_id) == ("delivered", 2)


async def test_a_takeover_before_the_message_was_sent_delivers_it_once(
    dev_server: WorkflowEnvironment,
    sink: RunningSink,
    pool: AsyncConnectionPool,
    settings: EmailSettings,
    worker: Worker,
    tasks: TaskClient,
    database: str,
) -> None:
    workflow_id = await start_email(tasks, welcome_email())
    # The relay dies before the server's 354 (connecting, or in MAIL/RCPT): no mark.
    _, claim, _ = await dead_relay_claims(pool)
    message_id = claim.message.message_id

    async with running_relay(pool, settings) as relay:
        result = await asyncio.wait_for(tasks.result(workflow_id), timeout=HANG_SECONDS)
        await workflow_idle(dev_server.client, workflow_id)
        await relay_caught_up(tasks, sink)

    step = result.step("mail")
    assert result.state is TaskState.SUCCEEDED and step.resource_id == message_id
    assert [attempt.outcome for attempt in step.attempts] == [OutcomeClass.SUCCEEDED]
    assert sink.sink.deliveries(message_id) == 1 and sink.sink.applications(message_id) == 1
    [dead, taken_over] = deliveries(database, message_id)
    assert dead == (DEAD, False, "transient")  # closed by the takeover: nothing was sent
    assert taken_over == (relay.relay_id, True, "delivered")
    assert outbox_row(database, message_id) == ("delivered", 1)
