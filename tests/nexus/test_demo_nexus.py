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
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.nexus import NexusPrincipal, ensure_nexus_endpoint
from onceflow.payments import StripePaymentProvider
from onceflow.task_api import TaskClient
from tests.payments.conftest import charge_intents

from .onceflow_side import replay_caller_histories, serving_nexus

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]

PRINCIPAL = NexusPrincipal(tenant="dev", name="dev-agent")


@pytest.fixture
async def onceflow_worker(
    dev_server: WorkflowEnvironment,
    pool: AsyncConnectionPool,
    payment_provider: StripePaymentProvider,
    task_queue: str,
) -> AsyncIterator[Worker]:
    async with serving_nexus(
        dev_server.client, pool, payment_provider, task_queue, PRINCIPAL, ["*"]
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
    assert len(await charge_intents(control)) == 2

    # The agent application's histories replay, with its own plugin.
    query = "WorkflowType = 'CheckoutAgent'"
    replayed = await replay_caller_histories(
        dev_server.client, query, [CheckoutAgent], "checkout-agents"
    )
    assert replayed >= 2
