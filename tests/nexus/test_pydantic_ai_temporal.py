"""PydanticAI's Temporal durability calls onceflow over Nexus
(``onceflow_client.pydantic_ai_temporal``): one charge at the provider, the model's repeat
answered "already done", and the caller's history replays."""

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from onceflow_client.pydantic_ai_temporal import ALREADY_DONE
from onceflow_devstack.stripe_provider import Fault, ProviderControl
from psycopg_pool import AsyncConnectionPool
from pydantic_ai.durable_exec.temporal import AgentPlugin, PydanticAIPlugin
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from onceflow.gateway import PrincipalStore
from onceflow.nexus import NexusCaller, ensure_nexus_endpoint
from onceflow.payments import StripePaymentProvider
from onceflow.settings import OnceflowSettings
from onceflow.task_api import TaskClient
from onceflow.tools.worker import derive_task_workflow_id
from onceflow.worker import build_worker
from onceflow.workflows.task_models import ReconcileDecision, ReconcileInput
from tests.harness import eventually
from tests.payments.conftest import PAYMENT_TOOLS, TENANT, VISA_CHARGE

from .pydantic_ai_caller import ENDPOINT, PaymentsAgentWorkflow, agent

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]

ONCEFLOW_QUEUE = f"test-pydantic-ai-{uuid.uuid4().hex[:8]}"
"""onceflow's queue for this module's tests: the agent's endpoint (a module constant, as
in a user's code) routes there for the whole session."""


@pytest.fixture
def task_queue() -> str:
    return ONCEFLOW_QUEUE


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


@pytest.fixture
async def caller(dev_server: WorkflowEnvironment) -> AsyncIterator[Client]:
    """The caller's application, as its user builds it: its own client, and (in the
    test) its own worker. Its histories are replayed at the end with its own plugins."""
    client = await Client.connect(
        dev_server.client.service_client.config.target_host, plugins=[PydanticAIPlugin()]
    )
    started.clear()
    yield client
    replayer = Replayer(
        workflows=[PaymentsAgentWorkflow], plugins=[PydanticAIPlugin(), AgentPlugin(agent)]
    )
    for workflow_id in started:
        history = await client.get_workflow_handle(workflow_id).fetch_history()
        replay = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert replay.replay_failure is None, replay.replay_failure


started: list[str] = []


async def run_agent(caller: Client, charge: dict[str, object]) -> WorkflowHandle[Any, str]:
    handle = await caller.start_workflow(
        PaymentsAgentWorkflow.run,
        json.dumps(charge),
        id=f"pai-agent-{uuid.uuid4().hex[:12]}",
        task_queue=CALLER_QUEUE,
    )
    started.append(handle.id)
    return handle


CALLER_QUEUE = f"caller-pydantic-ai-{uuid.uuid4().hex[:8]}"


def caller_worker(caller: Client) -> Worker:
    return Worker(
        caller,
        task_queue=CALLER_QUEUE,
        workflows=[PaymentsAgentWorkflow],
        plugins=[AgentPlugin(agent)],
    )


async def charges(control: ProviderControl) -> list[str]:
    return [entry.object_id for entry in await control.ledger() if entry.kind == "charge"]


async def test_a_durable_pydantic_ai_agent_charges_once_and_its_repeat_is_already_done(
    onceflow_worker: Worker, caller: Client, control: ProviderControl
) -> None:
    charge = {**VISA_CHARGE, "order_id": f"ord-pai-{uuid.uuid4().hex[:6]}"}
    async with caller_worker(caller):
        first, repeat = json.loads(await (await run_agent(caller, charge)).result())

    [intent] = await charges(control)
    assert intent in json.dumps(first)
    assert isinstance(repeat, str) and repeat.startswith(ALREADY_DONE) and intent in repeat
    assert "repeat_of" in repeat


async def test_a_parked_call_holds_the_agent_until_it_is_reconciled_then_the_run_goes_on(
    dev_server: WorkflowEnvironment,
    onceflow_worker: Worker,
    caller: Client,
    control: ProviderControl,
    task_queue: str,
) -> None:
    # Stripe charges but answers 500 (stored under the key), reads fail, search lags.
    await control.configure(search_lag_seconds=3600)
    await control.add_fault(Fault.ERROR_500_AFTER_COMMIT, path_prefix="/v1/payment_intents")
    await control.add_fault(
        Fault.ERROR_503, method="GET", path_prefix="/v1/payment_intents", times=None
    )
    tasks = TaskClient(dev_server.client, task_queue=task_queue)
    charge = {**VISA_CHARGE, "order_id": f"ord-pai-{uuid.uuid4().hex[:6]}"}
    async with caller_worker(caller):
        handle = await run_agent(caller, charge)
        # The model's first tool call, as the handler derives its task.
        task_id = derive_task_workflow_id(
            tenant=TENANT,
            scope=f"{TENANT}:agents:charge_payment:nexus",
            idempotency_key=NexusCaller(
                namespace=caller.namespace, workflow_id=handle.id, request_id=""
            ).call_key("call_first"),
        )
        await eventually(
            lambda: tasks.summary(task_id),
            until=lambda summary: summary is not None and summary.state == "parked",
            what="the agent's charge parks",
            timeout=120,
        )
        await control.clear_faults()
        assert (await handle.describe()).status is WorkflowExecutionStatus.RUNNING
        [intent] = await charges(control)
        await tasks.reconcile(
            task_id,
            ReconcileInput(
                step_id="1",
                decision=ReconcileDecision.HAPPENED,
                resource_id=intent,
                operator="ops@acme",
                reason="found in the dashboard",
            ),
        )
        first, repeat = json.loads(await handle.result())

    # The model is told the charge the operator's decision made known, verified.
    assert first["payment_intent"] == intent and first["reconciled"] is True
    assert isinstance(repeat, str) and repeat.startswith(ALREADY_DONE) and intent in repeat
    assert await charges(control) == [intent]
