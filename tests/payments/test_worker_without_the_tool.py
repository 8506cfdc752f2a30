"""A worker without the payments family, alone on the queue with a charge task a full
worker parked: it replays the task, answers its status and takes the operator's decision
(history holds everything either needs, never this worker's catalogue), then fails the
workflow task that would send the next attempt, naming the tool and what to deploy. A
full worker started afterwards sends it: one PaymentIntent at the provider.

Real ``onceflow worker`` processes configured through the environment, the local
Stripe-compatible provider as the far side, the CLI as the operator's hand.
"""

import asyncio
import uuid

from onceflow_devstack.stripe_provider import Fault, ProviderControl
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from onceflow.task_api import TaskClient
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.task_models import StepState, TaskState
from tests.harness import HANG_SECONDS, REPO, eventually, onceflow_command

from .conftest import (
    TENANT,
    VISA_CHARGE,
    AdmittingClient,
    WorkerProcess,
    queue_boundary,
    start_task,
)
from .test_worker_crash import operator_of


async def test_a_worker_without_the_tool_answers_and_takes_decisions_then_names_what_to_deploy(
    dev_server: WorkflowEnvironment,
    worker_process: WorkerProcess,
    admitting: AdmittingClient,
    control: ProviderControl,
    process_environment: dict[str, str],
    database: str,
    task_queue: str,
) -> None:
    tasks: TaskClient = admitting()
    full = await worker_process()
    # Nothing charged, a 500 stored under the key, and a search that lags: it parks.
    order = f"ord-{uuid.uuid4().hex[:8]}"
    await control.configure(search_lag_seconds=3600)
    await control.add_fault(Fault.ERROR_500_BEFORE_COMMIT, path_prefix="/v1/payment_intents")
    workflow_id = await start_task(
        tasks, ("pay", "charge_payment", {**VISA_CHARGE, "order_id": order})
    )
    handle = dev_server.client.get_workflow_handle(workflow_id)

    async def state() -> TaskState:
        return (await handle.query(AgentTaskWorkflow.status)).state

    await eventually(
        state, until=lambda seen: seen is TaskState.PARKED, what="the charge parks", timeout=180
    )
    await control.clear_faults()
    await control.configure(search_lag_seconds=0)
    full.terminate()
    assert await full.wait() == 0
    assert await control.ledger() == []

    await worker_process(ONCEFLOW_BUILTIN_TOOLS="issue_coupon")  # no payments family
    # Status through the gateway: answered by the worker without the tool.
    async with queue_boundary(dev_server, database, task_queue) as service:
        parked = await service.task_status(operator_of(TENANT), workflow_id)
    assert parked.state is TaskState.PARKED and parked.step("pay").state is StepState.PARKED

    # The operator's decision, taken and answered by that worker: the check's look-up
    # could not run there (no such activity), so only the operator's word can decide.
    reconcile = [
        *onceflow_command("reconcile", workflow_id),
        *("--step", "pay", "--decision", "did_not_happen", "--unverified"),
        *("--reason", "no charge in the Stripe dashboard"),
    ]
    # Without blocking the event loop: the provider is served in it.
    decided = await asyncio.create_subprocess_exec(
        *reconcile,
        cwd=REPO,
        env=process_environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(decided.communicate(), HANG_SECONDS)
    assert decided.returncode == 0, output.decode()
    status = await handle.query(AgentTaskWorkflow.status)
    [decision] = status.decisions
    assert decision.accepted and decision.decision == "did_not_happen"
    assert decision.verified is False

    # The attempt that follows cannot run on this worker: its workflow task fails (and
    # Temporal retries it), saying which tool is missing and what to deploy.
    async def failures() -> list[str]:
        return [
            event.workflow_task_failed_event_attributes.failure.message
            async for event in handle.fetch_history_events()
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
        ]

    [failure, *_] = await eventually(
        failures, what="the attempt's workflow task fails", timeout=180
    )
    assert "cannot run step pay's next attempt: tool 'charge_payment'" in failure
    assert "Deploy a worker that serves it" in failure
    assert await control.ledger() == []  # nothing was sent

    # A full worker takes over: the operator's attempt goes out, once.
    await worker_process()
    result = await TaskClient(dev_server.client, task_queue=task_queue).result(workflow_id)
    assert result.state is TaskState.SUCCEEDED, result.failure_reason
    charges = [entry for entry in await control.ledger() if entry.kind == "charge"]
    assert len(charges) == 1 and charges[0].object_id == result.step("pay").resource_id
