"""Only the workflow re-arms an email: a refusal before the message was sent is retried
within the task's budget (the same row, armed again); a permanent one is tried once."""

import asyncio

from onceflow_devstack.smtp_sink import RunningSink, SinkFault
from temporalio.worker import Worker

from onceflow.email import OutboxRelay
from onceflow.retry_policy import OutcomeClass
from onceflow.task_api import TaskClient
from onceflow.workflows.task_models import TaskState
from tests.harness import HANG_SECONDS

from .conftest import deliveries, outbox_row, start_email, welcome_email


async def test_a_deferred_email_is_armed_again_by_the_workflow_and_delivered_once(
    sink: RunningSink, relay: OutboxRelay, worker: Worker, tasks: TaskClient, database: str
) -> None:
    sink.sink.add_fault(SinkFault.DEFER_RCPT)
    workflow_id = await start_email(tasks, welcome_email())
    result = await asyncio.wait_for(tasks.result(workflow_id), timeout=HANG_SECONDS)

    step = result.step("mail")
    message_id = step.resource_id or ""
    assert result.state is TaskState.SUCCEEDED
    assert [attempt.outcome for attempt in step.attempts] == [
        OutcomeClass.TRANSIENT,
        OutcomeClass.SUCCEEDED,
    ]
    assert "451" in (step.attempts[0].evidence.get("smtp_reply") or "")
    assert [outcome for _, _, outcome in deliveries(database, message_id)] == [
        "transient",
        "delivered",
    ]
    assert outbox_row(database, message_id) == ("delivered", 2)
    assert sink.sink.deliveries(message_id) == 1 and sink.sink.applications(message_id) == 1


async def test_a_rejected_email_is_tried_once(
    sink: RunningSink, relay: OutboxRelay, worker: Worker, tasks: TaskClient, database: str
) -> None:
    sink.sink.add_fault(SinkFault.REJECT_RCPT)
    workflow_id = await start_email(tasks, welcome_email())
    result = await asyncio.wait_for(tasks.result(workflow_id), timeout=HANG_SECONDS)

    step = result.step("mail")
    message_id = step.evidence["message_id"]
    assert result.state is TaskState.FAILED
    assert [attempt.outcome for attempt in step.attempts] == [OutcomeClass.REJECTED]
    assert "refused RCPT TO (recipient 1 of 1) permanently" in (step.attempts[0].reason or "")
    assert outbox_row(database, message_id) == ("rejected", 1)
    assert sink.sink.received == []
