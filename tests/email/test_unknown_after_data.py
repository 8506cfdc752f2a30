"""SMTP answers DATA, then the connection drops: the step parks and nothing is resent
until an operator decides; only "did not happen" authorises exactly one more delivery."""

import asyncio

import pytest
from onceflow_devstack.smtp_sink import RunningSink, SinkFault
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.email import OutboxRelay
from onceflow.retry_policy import OutcomeClass
from onceflow.task_api import DecisionRefused, TaskClient
from onceflow.workflows.task_models import ReconcileDecision, ReconcileInput, StepState, TaskState
from tests.harness import HANG_SECONDS, workflow_idle

from .conftest import (
    deliveries,
    outbox_row,
    parked,
    relay_caught_up,
    start_email,
    wait_for,
    welcome_email,
)


async def quiet(
    dev_server: WorkflowEnvironment, tasks: TaskClient, sink: RunningSink, task: str
) -> None:
    """Nothing more can happen by itself: the task has nothing pending (no timer, no
    attempt in flight) and the relay has worked through everything armed before now."""
    await workflow_idle(dev_server.client, task)
    await relay_caught_up(tasks, sink)


async def park_on_a_dropped_reply(
    dev_server: WorkflowEnvironment,
    tasks: TaskClient,
    sink: RunningSink,
    database: str,
    *,
    server_kept_it: bool,
) -> tuple[str, str]:
    sink.sink.add_fault(SinkFault.DROP_AFTER_DATA, apply=server_kept_it)
    workflow_id = await start_email(tasks, welcome_email())
    status = await wait_for(tasks, workflow_id, parked)
    step = status.step("mail")
    message_id = step.evidence["message_id"]
    assert [attempt.outcome for attempt in step.attempts] == [OutcomeClass.UNKNOWN]
    assert "after the message was sent" in (step.attempts[0].reason or "")
    assert "not provably safe" in (step.park_reason or "")
    assert step.evidence["outbox_state"] == "unknown"
    assert "the outbox row is unknown" in step.evidence["lookup"]  # looked up, inconclusive

    await quiet(dev_server, tasks, sink, workflow_id)
    assert (await tasks.status(workflow_id)).state is TaskState.PARKED
    assert sink.sink.deliveries(message_id) == 1  # parked: nothing resent on its own
    assert [outcome for _, _, outcome in deliveries(database, message_id)] == ["unknown"]
    return workflow_id, message_id


async def test_did_not_happen_authorises_exactly_one_more_delivery(
    dev_server: WorkflowEnvironment,
    sink: RunningSink,
    relay: OutboxRelay,
    worker: Worker,
    tasks: TaskClient,
    database: str,
) -> None:
    workflow_id, message_id = await park_on_a_dropped_reply(
        dev_server, tasks, sink, database, server_kept_it=False
    )
    assert sink.sink.applications(message_id) == 0  # the server lost it, as the operator finds

    # The outbox cannot prove the SMTP server did not take it: refused, nothing sent...
    decision = ReconcileInput(
        step_id="mail",
        decision=ReconcileDecision.DID_NOT_HAPPEN,
        operator="ops-oncall",
        reason="not in the recipient's mailbox",
    )
    with pytest.raises(DecisionRefused, match="could not show that step mail's effect"):
        await tasks.reconcile(workflow_id, decision)
    assert sink.sink.applications(message_id) == 0
    # ... until the operator, who looked in the mailbox, takes it on their word.
    await tasks.reconcile(workflow_id, decision.model_copy(update={"unverified": True}))
    result = await asyncio.wait_for(tasks.result(workflow_id), timeout=HANG_SECONDS)
    await quiet(dev_server, tasks, sink, workflow_id)

    step = result.step("mail")
    assert result.state is TaskState.SUCCEEDED and step.state is StepState.SUCCEEDED
    assert step.resource_id == message_id
    assert [(a.outcome, a.operator_authorised) for a in step.attempts] == [
        (OutcomeClass.UNKNOWN, False),
        (OutcomeClass.SUCCEEDED, True),
    ]
    assert sink.sink.deliveries(message_id) == 2  # exactly one more delivery attempt
    assert sink.sink.applications(message_id) == 1
    assert [outcome for _, _, outcome in deliveries(database, message_id)] == [
        "unknown",
        "delivered",
    ]
    assert outbox_row(database, message_id) == ("delivered", 2)


async def test_happened_sends_nothing_more(
    dev_server: WorkflowEnvironment,
    sink: RunningSink,
    relay: OutboxRelay,
    worker: Worker,
    tasks: TaskClient,
    database: str,
) -> None:
    workflow_id, message_id = await park_on_a_dropped_reply(
        dev_server, tasks, sink, database, server_kept_it=True
    )
    assert sink.sink.applications(message_id) == 1  # the server kept it, as the operator finds

    await tasks.reconcile(
        workflow_id,
        ReconcileInput(
            step_id="mail",
            decision=ReconcileDecision.HAPPENED,
            operator="ops-oncall",
            reason="the customer received it",
            resource_id=message_id,
        ),
    )
    result = await asyncio.wait_for(tasks.result(workflow_id), timeout=HANG_SECONDS)
    await quiet(dev_server, tasks, sink, workflow_id)

    step = result.step("mail")
    assert result.state is TaskState.SUCCEEDED
    assert step.resource_id == message_id and step.result == {"reconciled": True}
    assert len(step.attempts) == 1
    assert sink.sink.deliveries(message_id) == 1
    assert len(deliveries(database, message_id)) == 1
    assert outbox_row(database, message_id) == ("unknown", 1)  # never armed again
