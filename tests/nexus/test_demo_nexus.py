"""The Nexus part of ``onceflow demo``, run against the test's servers: its agent charges
once through a lost answer, and waits through a park until the demo reconciles it."""

import uuid
from collections.abc import AsyncIterator

import pytest
from onceflow_devstack.demo_nexus import nexus_scenario
from onceflow_devstack.nexus_agent import CheckoutAgent
from onceflow_devstack.stripe_provider import ProviderControl, RunningProvider
from psycopg_pool import AsyncConnectionPool
from rich.console import Console
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.plugin import SimplePlugin
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from onceflow.gateway import PrincipalStore
from onceflow.nexus import NexusPrincipal, ensure_nexus_endpoint
from onceflow.payments import StripePaymentProvider
from onceflow.settings import OnceflowSettings
from onceflow.task_api import TaskClient
from onceflow.worker import build_worker
from tests.payments.conftest import PAYMENT_TOOLS

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]

PRINCIPAL = NexusPrincipal(tenant="dev", name="dev-agent")


@pytest.fixture
async def onceflow_worker(
    dev_server: WorkflowEnvironment,
    pool: AsyncConnectionPool,
    payment_provider: StripePaymentProvider,
    task_queue: str,
) -> AsyncIterator[Worker]:
    await PrincipalStore(pool).create(tenant=PRINCIPAL.tenant, name=PRINCIPAL.name, tools=["*"])
    settings = OnceflowSettings(
        task_queue=task_queue, shutdown_grace_seconds=1, nexus_principal=str(PRINCIPAL)
    )
    async with build_worker(
        dev_server.client,
        pool,
        settings,
        tools=PAYMENT_TOOLS,
        clients={tool.name: payment_provider for tool in PAYMENT_TOOLS},
    ) as running:
        yield running


async def test_the_nexus_demo_charges_once_and_its_agent_waits_through_the_park(
    dev_server: WorkflowEnvironment,
    onceflow_worker: Worker,
    provider: RunningProvider,
    control: ProviderControl,
    task_queue: str,
) -> None:
    endpoint = f"onceflow-tools-{uuid.uuid4().hex[:8]}"
    await ensure_nexus_endpoint(dev_server.client, name=endpoint, task_queue=task_queue)
    console = Console(record=True, width=200)

    await nexus_scenario(
        console,
        TaskClient(dev_server.client, task_queue=task_queue),
        provider.base_url,
        temporal_address=dev_server.client.service_client.config.target_host,
        principal=PRINCIPAL,
        endpoint=endpoint,
        ui_url="http://localhost:8233",
    )

    text = console.export_text()
    assert text.count("1 charge at the provider") == 1, text
    assert "is parked; the agent's workflow is still running" in text, text
    assert "Charges at the provider for this call: 1." in text, text
    # Two checkouts, one PaymentIntent each, whatever went wrong on the way.
    assert len([e for e in await control.ledger() if e.kind == "charge"]) == 2

    # The agent application's histories replay, with its own plugin.
    histories = dev_server.client.list_workflows("WorkflowType = 'CheckoutAgent'").map_histories()
    replayer = Replayer(
        workflows=[CheckoutAgent],
        plugins=[SimplePlugin("checkout-agents", data_converter=pydantic_data_converter)],
    )
    replayed = 0
    async with replayer.workflow_replay_iterator(histories) as replays:
        async for result in replays:
            replayed += 1
            assert result.replay_failure is None, result.replay_failure
    assert replayed >= 2
