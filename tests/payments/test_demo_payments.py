"""The payments part of ``make demo`` runs against a worker and the local provider."""

import io

import pytest
from onceflow_devstack.demo_payments import payments_scenario
from onceflow_devstack.stripe_provider import ProviderControl, RunningProvider
from rich.console import Console
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.task_api import TaskClient

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]


async def test_the_demo_shows_one_charge_for_a_lost_answer_and_parks_the_other(
    dev_server: WorkflowEnvironment,
    worker: Worker,
    tasks: TaskClient,
    provider: RunningProvider,
    control: ProviderControl,
) -> None:
    output = io.StringIO()
    console = Console(file=output, width=200, color_system=None)
    await payments_scenario(console, tasks, provider.base_url, ui_url="http://localhost:8233")

    text = output.getvalue()
    lost, parked = await control.ledger(), None
    assert len(lost) == 2  # one charge per task, although both tasks repeated their POST
    assert len({entry.idempotency_key for entry in lost}) == 2
    assert "1 charge for this task" in text
    assert "task state: parked" in text
    parked = lost[1]
    assert f"--decision happened --resource-id {parked.object_id}" in text
    assert "onceflow reconcile task-" in text and "--decision happened|did_not_happen" in text
    # The demo leaves the provider as it found it.
    assert await control.faults() == []
    assert provider.provider.config.search_lag_seconds == 0
    workflow_id = parked.metadata["onceflow_workflow_id"]
    await dev_server.client.get_workflow_handle(workflow_id).terminate("test over")
