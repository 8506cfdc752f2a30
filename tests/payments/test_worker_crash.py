"""Worker processes SIGKILLed between the provider's commit and the activity's report,
or paused (SIGSTOP) after the workflow decided a retry until the provider forgot the key.

Real ``onceflow worker`` processes, configured only through the environment as in
production; the payment settings they share (attempt timeout, Stripe account) are the
ones the workflow reads, which is why every worker must get the same values.
"""

import asyncio
import os
import signal
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from onceflow_devstack.stripe_provider import Fault, ProviderControl
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from onceflow.errors import TaskNotFound, TaskUnanswered
from onceflow.gateway import GatewaySettings, open_boundary
from onceflow.gateway._principals import Principal
from onceflow.retry_policy import RetryBudget
from onceflow.settings import OnceflowSettings
from onceflow.task_api import TaskClient
from onceflow.tools.worker import derive_child_key
from onceflow.workflows.task_models import AgentTaskInput, OpenTaskOptions, TaskState
from tests.harness import HANG_SECONDS, eventually, is_key_window_timer

from .conftest import (
    ACCOUNT,
    TENANT,
    VISA_CHARGE,
    AdmittingClient,
    WorkerProcess,
    operation_row,
    queue_boundary,
    start_task,
)

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]


async def test_a_worker_killed_after_the_provider_committed_leaves_one_charge(
    worker_process: WorkerProcess,
    admitting: AdmittingClient,
    control: ProviderControl,
    database: str,
) -> None:
    tasks = admitting()
    first = await worker_process()
    # The provider commits, then holds the answer long enough to kill the worker.
    await control.add_fault(
        Fault.DELAY_AFTER_COMMIT, path_prefix="/v1/payment_intents", delay_seconds=30
    )
    workflow_id = await start_task(tasks, ("pay", "charge_payment", VISA_CHARGE))
    await eventually(control.ledger, what="the provider committed the charge", interval=0.02)

    os.kill(first.pid, signal.SIGKILL)
    await first.wait()
    key = derive_child_key(
        tenant=TENANT,
        workflow_id=workflow_id,
        step_id="pay",
        child_op="charge",
        provider_account=ACCOUNT,
    )
    # Killed before it could record anything but its intent to call.
    assert operation_row(database, key)[:2] == ("started", None)

    await worker_process()
    result = await asyncio.wait_for(tasks.result(workflow_id), timeout=HANG_SECONDS)

    [entry] = await control.ledger()
    assert result.state is TaskState.SUCCEEDED
    assert result.step("pay").resource_id == entry.object_id
    assert "did not report" in (result.step("pay").attempts[0].reason or "")
    posts = [r for r in await control.requests() if r.method == "POST"]
    assert [(r.idempotency_key, r.outcome) for r in posts] == [
        (key, "executed"),
        (key, "replayed"),
    ]
    assert operation_row(database, key)[:3] == ("succeeded", entry.object_id, entry.request_id)


KEY_RETENTION_SECONDS = 5
SHORT_KEY_WINDOW = {
    # The provider forgets keys after 5 s and the workers know it: a key may be sent
    # until 4 s after its first send.
    "ONCEFLOW_PAYMENTS_KEY_RETENTION": f"PT{KEY_RETENTION_SECONDS}S",
    "ONCEFLOW_PAYMENTS_RETENTION_MARGIN": "PT1S",
    "ONCEFLOW_PAYMENTS_ATTEMPT_TIMEOUT": "PT3.5S",
}
RETRY_IN_UP_TO_3S = RetryBudget(
    initial_backoff=timedelta(seconds=3), max_backoff=timedelta(seconds=3)
)
"""The first retry waits a jittered 0-3 s: room to pause the worker during it."""


async def retry_decided(client: Client, workflow_id: str) -> list[HistoryEvent]:
    """The task's history once the workflow has started a backoff timer."""
    handle = client.get_workflow_handle(workflow_id)

    async def history() -> list[HistoryEvent]:
        return [event async for event in handle.fetch_history_events()]

    return await eventually(
        history,
        what="the workflow decided a retry",
        until=lambda events: any(
            e.event_type == EventType.EVENT_TYPE_TIMER_STARTED and not is_key_window_timer(e)
            for e in events
        ),
        interval=0.01,
    )


async def backoff_ended(handle: WorkflowHandle[Any, Any]) -> bool:
    """Whether the task's backoff timer fired or was cancelled (its key window's did not
    count)."""
    backoffs: set[str] = set()
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_TIMER_STARTED and not is_key_window_timer(
            event
        ):
            backoffs.add(event.timer_started_event_attributes.timer_id)
        elif event.event_type == EventType.EVENT_TYPE_TIMER_FIRED:
            if event.timer_fired_event_attributes.timer_id in backoffs:
                return True
        elif event.event_type == EventType.EVENT_TYPE_TIMER_CANCELED:
            if event.timer_canceled_event_attributes.timer_id in backoffs:
                return True
    return False


async def test_a_worker_paused_after_a_retry_was_decided_never_sends_the_forgotten_key(
    dev_server: WorkflowEnvironment,
    worker_process: WorkerProcess,
    admitting: AdmittingClient,
    control: ProviderControl,
) -> None:
    tasks = admitting(**SHORT_KEY_WINDOW)
    await control.configure(key_retention_seconds=KEY_RETENTION_SECONDS, search_lag_seconds=3600)
    # Each round: Stripe charges, the connection drops before the answer (unknown); the
    # workflow decides a same-key retry inside the window and starts its backoff timer.
    # The round counts only if the worker was paused before that timer fired.
    for _ in range(5):
        worker = await worker_process(**SHORT_KEY_WINDOW)
        await control.add_fault(Fault.DROP_AFTER_COMMIT, path_prefix="/v1/payment_intents")
        workflow_id = await start_task(
            tasks, ("pay", "charge_payment", VISA_CHARGE), budget=RETRY_IN_UP_TO_3S
        )
        await retry_decided(dev_server.client, workflow_id)
        worker.send_signal(signal.SIGSTOP)
        paused_at = datetime.now(UTC)
        handle = dev_server.client.get_workflow_handle(workflow_id)
        if not await backoff_ended(handle):
            break
        worker.send_signal(signal.SIGCONT)  # the retry ran before the pause: again
        await tasks.result(workflow_id)
        await control.clear_faults()
    else:
        raise AssertionError("the worker never paused during a backoff in 5 rounds")
    # Paused until the provider has forgotten the key (a wall-clock window, no event).
    await asyncio.sleep(KEY_RETENTION_SECONDS + 1)  # scenario: paused past the key window
    assert (datetime.now(UTC) - paused_at).total_seconds() > KEY_RETENTION_SECONDS
    worker.send_signal(signal.SIGCONT)

    result = await tasks.result(workflow_id)

    step = result.step("pay")
    # Caught by the workflow, whose key window timer fired during the pause, or by the
    # attempt where the key leaves: either way nothing sent. The look-up that follows
    # reads the customer's PaymentIntents (consistent, unlike the lagging search) and
    # finds the charge: no person needed.
    assert any("send-by deadline" in (a.reason or "") for a in step.attempts) or (
        "send window of the step's key closed" in step.evidence.get("looked_up_because", "")
    ), step.attempts
    assert result.state is TaskState.SUCCEEDED and step.result["found_by"] == "lookup:list"
    key = derive_child_key(
        tenant=TENANT,
        workflow_id=workflow_id,
        step_id="pay",
        child_op="charge",
        provider_account=ACCOUNT,
    )
    sent = [r for r in await control.requests() if r.idempotency_key == key]
    assert [r.outcome for r in sent] == ["executed"]  # never sent again
    [charge] = [entry for entry in await control.ledger() if entry.idempotency_key == key]
    assert step.resource_id == charge.object_id


def operator_of(tenant: str) -> Principal:
    return Principal(
        principal_id=uuid.uuid4(),
        tenant=tenant,
        name="ops",
        allowed_tools=frozenset(),
        may_decide=True,
        key_quota=None,
    )


async def test_a_crashed_workers_tasks_answer_their_status_through_another_worker(
    dev_server: WorkflowEnvironment,
    worker_process: WorkerProcess,
    tasks: TaskClient,
    database: str,
    task_queue: str,
) -> None:
    # Open tasks spread over two workers, each cached where its first workflow task ran.
    first = await worker_process()
    await worker_process()
    ids = [f"cached-{n}-{uuid.uuid4().hex}" for n in range(6)]
    for workflow_id in ids:
        await tasks.start(
            AgentTaskInput(tenant=TENANT, principal="agent", open=OpenTaskOptions()),
            workflow_id=workflow_id,
        )
    for workflow_id in ids:
        await tasks.status(workflow_id)
    cached_on_first = [
        workflow_id
        for workflow_id in ids
        if await ran_first_task_on(dev_server.client, workflow_id, first)
    ]
    assert cached_on_first, "no task was cached on the first worker"
    first.send_signal(signal.SIGKILL)
    await first.wait()

    # The gateway answers every one of them within its deadline: the other worker takes
    # the queries once the dead worker's queue times out.
    async with queue_boundary(dev_server, database, task_queue) as service:
        for workflow_id in ids:
            status = await service.task_status(operator_of(TENANT), workflow_id)
            assert status.workflow_id == workflow_id and status.open


async def test_a_task_no_worker_serves_is_reported_as_such_not_as_missing(
    dev_server: WorkflowEnvironment, database: str
) -> None:
    nobody = f"nobody-{uuid.uuid4().hex}"
    workflow_id = f"unserved-{uuid.uuid4().hex}"
    await TaskClient(dev_server.client, task_queue=nobody).start(
        AgentTaskInput(tenant=TENANT, principal="agent", open=OpenTaskOptions()),
        workflow_id=workflow_id,
    )
    async with open_boundary(
        OnceflowSettings(task_queue=nobody),
        GatewaySettings(),
        database_url=database,
        temporal_address=dev_server.client.service_client.config.target_host,
    ) as service:
        with pytest.raises(TaskUnanswered) as unanswered:
            await service.task_status(operator_of(TENANT), workflow_id)
        assert "no worker polls its task queue" in unanswered.value.detail
        assert unanswered.value.status == 503
        # Another tenant asking learns nothing: the same answer as a missing task.
        with pytest.raises(TaskNotFound):
            await service.task_status(operator_of("another-tenant"), workflow_id)
        with pytest.raises(TaskNotFound):
            await service.task_status(operator_of(TENANT), f"missing-{uuid.uuid4().hex}")
    await dev_server.client.get_workflow_handle(workflow_id).terminate("test over")


async def ran_first_task_on(
    client: Client, workflow_id: str, worker: asyncio.subprocess.Process
) -> bool:
    """Whether the task's first workflow task ran in ``worker``'s process."""
    handle = client.get_workflow_handle(workflow_id)
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            return event.workflow_task_started_event_attributes.identity.startswith(
                f"{worker.pid}@"
            )
    return False
