"""PydanticAI's Temporal durability calls onceflow over Nexus
(``onceflow_client.pydantic_ai_temporal``): one charge at the provider, the model's repeat
answered "already done", and the caller's history replays."""

import json
import uuid
from collections.abc import AsyncIterator

import pytest
from onceflow_client.pydantic_ai_temporal import ALREADY_DONE
from onceflow_devstack.stripe_provider import ProviderControl
from psycopg_pool import AsyncConnectionPool
from pydantic_ai.durable_exec.temporal import AgentPlugin, PydanticAIPlugin
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from onceflow.gateway import PrincipalStore
from onceflow.nexus import ensure_nexus_endpoint
from onceflow.payments import StripePaymentProvider
from onceflow.settings import OnceflowSettings
from onceflow.worker import build_worker
from tests.payments.conftest import PAYMENT_TOOLS, TENANT, VISA_CHARGE

from .pydantic_ai_caller import ENDPOINT, PaymentsAgentWorkflow, agent

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]


@pytest.fixture
async def onceflow_worker(
    dev_server: WorkflowEnvironment,
    pool: AsyncConnectionPool,
    payment_provider: StripePaymentProvider,
    task_queue: str,
) -> AsyncIterator[Worker]:
    await PrincipalStore(pool).create(tenant=TENANT, name="agents", tools=["charge_payment"])
    await ensure_nexus_endpoint(dev_server.client, name=ENDPOINT, task_queue=task_queue)
    settings = OnceflowSettings(
        task_queue=task_queue, shutdown_grace_seconds=1, nexus_principal=f"{TENANT}/agents"
    )
    async with build_worker(
        dev_server.client,
        pool,
        settings,
        tools=PAYMENT_TOOLS,
        clients={tool.name: payment_provider for tool in PAYMENT_TOOLS},
    ) as running:
        yield running


async def test_a_durable_pydantic_ai_agent_charges_once_and_its_repeat_is_already_done(
    dev_server: WorkflowEnvironment, onceflow_worker: Worker, control: ProviderControl
) -> None:
    # The caller's application, as its user builds it: its own client and worker.
    caller = await Client.connect(
        dev_server.client.service_client.config.target_host, plugins=[PydanticAIPlugin()]
    )
    queue = f"caller-{uuid.uuid4().hex[:12]}"
    charge = {**VISA_CHARGE, "order_id": f"ord-pai-{uuid.uuid4().hex[:6]}"}
    async with Worker(
        caller, task_queue=queue, workflows=[PaymentsAgentWorkflow], plugins=[AgentPlugin(agent)]
    ):
        handle = await caller.start_workflow(
            PaymentsAgentWorkflow.run,
            json.dumps(charge),
            id=f"pai-agent-{uuid.uuid4().hex[:12]}",
            task_queue=queue,
        )
        first, repeat = json.loads(await handle.result())

    [intent] = [entry.object_id for entry in await control.ledger() if entry.kind == "charge"]
    assert intent in json.dumps(first)
    assert isinstance(repeat, str) and repeat.startswith(ALREADY_DONE) and intent in repeat
    assert "repeat_of" in repeat

    history = await handle.fetch_history()
    replay = await Replayer(
        workflows=[PaymentsAgentWorkflow], plugins=[PydanticAIPlugin(), AgentPlugin(agent)]
    ).replay_workflow(history, raise_on_replay_failure=False)
    assert replay.replay_failure is None, replay.replay_failure
