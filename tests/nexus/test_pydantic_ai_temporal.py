"""PydanticAI's Temporal durability calls onceflow over Nexus
(``onceflow_client.pydantic_ai_temporal``): one charge at the provider, the model's repeat
answered "already done", a parked call holding the agent until it is reconciled.

The caller (its workflow, its worker with PydanticAI's plugins and a scripted model:
``pydantic_ai_caller.py``) runs in the Makefile's client-only virtualenv, in a process that
replays its histories with its own plugins when it stops; onceflow's are replayed by the
session's."""

import json
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from onceflow_client.pydantic_ai_temporal import ALREADY_DONE
from onceflow_devstack.stripe_provider import Fault, ProviderControl
from psycopg_pool import AsyncConnectionPool
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

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

from .caller_process import PYDANTIC_AI_ENDPOINT as ENDPOINT
from .caller_process import PYDANTIC_AI_WORKFLOW as WORKFLOW
from .caller_venv import caller_running

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]

ONCEFLOW_QUEUE = f"test-pydantic-ai-{uuid.uuid4().hex[:8]}"
"""onceflow's queue for this module's tests: the agent's endpoint (a module constant, as
in a user's code) routes there for the whole session."""
CALLER_QUEUE = f"caller-pydantic-ai-{uuid.uuid4().hex[:8]}"


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


@pytest.fixture(scope="module")
def caller(dev_server: WorkflowEnvironment) -> Iterator[subprocess.Popen[str]]:
    """The caller application's worker, in the client-only virtualenv; when the module's
    tests are done it replays every history it ran, and none may diverge."""
    with caller_running(
        "pydantic_ai_caller",
        CALLER_QUEUE,
        dev_server.client.service_client.config.target_host,
        lambda: started,
    ) as process:
        yield process


started = 0


async def run_agent(
    dev_server: WorkflowEnvironment, charge: dict[str, object]
) -> WorkflowHandle[Any, str]:
    global started
    handle: WorkflowHandle[Any, str] = await dev_server.client.start_workflow(
        WORKFLOW,
        json.dumps(charge),
        id=f"pai-agent-{uuid.uuid4().hex[:12]}",
        task_queue=CALLER_QUEUE,
        result_type=str,
    )
    started += 1
    return handle


async def charges(control: ProviderControl) -> list[str]:
    return [entry.object_id for entry in await control.ledger() if entry.kind == "charge"]


async def test_a_durable_pydantic_ai_agent_charges_once_and_its_repeat_is_already_done(
    dev_server: WorkflowEnvironment,
    onceflow_worker: Worker,
    caller: subprocess.Popen[str],
    control: ProviderControl,
) -> None:
    charge = {**VISA_CHARGE, "order_id": f"ord-pai-{uuid.uuid4().hex[:6]}"}
    first, repeat = json.loads(await (await run_agent(dev_server, charge)).result())

    [intent] = await charges(control)
    assert intent in json.dumps(first)
    assert isinstance(repeat, str) and repeat.startswith(ALREADY_DONE) and intent in repeat
    assert "repeat_of" in repeat


async def test_a_parked_call_holds_the_agent_until_it_is_reconciled_then_the_run_goes_on(
    dev_server: WorkflowEnvironment,
    onceflow_worker: Worker,
    caller: subprocess.Popen[str],
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
    handle = await run_agent(dev_server, charge)
    # The model's first tool call, as the handler derives its task.
    task_id = derive_task_workflow_id(
        tenant=TENANT,
        scope=f"{TENANT}:agents:charge_payment:nexus",
        idempotency_key=NexusCaller(
            namespace=dev_server.client.namespace, workflow_id=handle.id, request_id=""
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
