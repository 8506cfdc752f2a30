"""The OpenAI Agents SDK's Temporal integration calls onceflow over Nexus
(``onceflow_client.openai_agents_temporal``): one charge at the provider, the model's repeat
answered "already done", a parked call holding the agent until it is reconciled.

The caller (its workflow, its worker with ``OpenAIAgentsPlugin`` and a scripted model:
``openai_agents_caller.py``) runs in the Makefile's client-only virtualenv (the integration
also pins an openai-agents this one cannot hold), in a process that replays its histories
with its own plugin when it stops; onceflow's are replayed by the session's."""

import json
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from onceflow_client._nexus_told import told_about_step
from onceflow_client.openai_agents_temporal import _output
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

from .caller_process import OPENAI_AGENTS_ENDPOINT as ENDPOINT
from .caller_process import OPENAI_AGENTS_WORKFLOW as WORKFLOW
from .caller_venv import caller_running

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]

ALREADY_DONE = "already done: "

ONCEFLOW_QUEUE = f"test-openai-agents-{uuid.uuid4().hex[:8]}"
"""onceflow's queue for this module's tests: the agent's endpoint (a module constant, as
in a user's code) routes there for the whole session."""
CALLER_QUEUE = f"caller-openai-agents-{uuid.uuid4().hex[:8]}"


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
    await PrincipalStore(pool).create(tenant=TENANT, name="oai-agents", tools=["charge_payment"])
    await ensure_nexus_endpoint(dev_server.client, name=ENDPOINT, task_queue=task_queue)
    settings = OnceflowSettings(
        task_queue=task_queue, shutdown_grace_seconds=1, nexus_principal=f"{TENANT}/oai-agents"
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
        "openai_agents_caller",
        CALLER_QUEUE,
        dev_server.client.service_client.config.target_host,
        lambda: started,
    ) as process:
        yield process


started = 0


async def run_agent(dev_server: WorkflowEnvironment, charge: dict[str, Any]) -> WorkflowHandle:
    global started
    handle: WorkflowHandle[Any, Any] = await dev_server.client.start_workflow(
        WORKFLOW,
        json.dumps(charge),
        id=f"oai-agent-{uuid.uuid4().hex[:12]}",
        task_queue=CALLER_QUEUE,
        result_type=str,
    )
    started += 1
    return handle


async def charges(control: ProviderControl) -> list[str]:
    return [entry.object_id for entry in await control.ledger() if entry.kind == "charge"]


async def test_an_openai_agent_in_a_workflow_charges_once_and_its_repeat_is_already_done(
    dev_server: WorkflowEnvironment,
    onceflow_worker: Worker,
    caller: subprocess.Popen[str],
    control: ProviderControl,
) -> None:
    charge = {**VISA_CHARGE, "order_id": f"ord-oai-{uuid.uuid4().hex[:6]}"}
    handle = await run_agent(dev_server, charge)
    first, repeat = json.loads(await handle.result())

    [intent] = await charges(control)
    assert json.loads(first)["payment_intent"] == intent
    assert repeat.startswith(ALREADY_DONE) and intent in repeat and "repeat_of" in repeat
    # Each tool call is a Nexus operation of the agent's workflow; its only activities
    # are the model's.
    events = (await handle.fetch_history()).events
    operations = [e for e in events if e.HasField("nexus_operation_scheduled_event_attributes")]
    activities = {
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.HasField("activity_task_scheduled_event_attributes")
    }
    assert len(operations) == 2 and activities == {"invoke_model_activity"}, activities


async def test_a_parked_call_holds_the_openai_agent_until_it_is_reconciled(
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
    charge = {**VISA_CHARGE, "order_id": f"ord-oai-{uuid.uuid4().hex[:6]}"}
    handle = await run_agent(dev_server, charge)
    # The model's first tool call, as the handler derives its task.
    task_id = derive_task_workflow_id(
        tenant=TENANT,
        scope=f"{TENANT}:oai-agents:charge_payment:nexus",
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
    told = json.loads(first)
    assert told["payment_intent"] == intent and told["reconciled"] is True
    assert repeat.startswith(ALREADY_DONE) and intent in repeat
    assert await charges(control) == [intent]


@pytest.mark.parametrize(
    ("step", "reads"),
    [
        ({"state": "succeeded", "resource_id": "pi_1"}, '{"resource_id": "pi_1"}'),
        (
            {
                "state": "failed",
                "failure_reason": "card_declined",
                "attempts": [{"outcome": "rejected"}],
            },
            "error: rejected, nothing was done: card_declined. You may correct the arguments",
        ),
        ({"state": "denied", "failure_reason": "no"}, "error: denied by a person: no. Do not"),
        ({"state": "abandoned"}, "error: abandoned by an operator: abandoned. Whether"),
        (
            {"state": "failed", "failure_reason": "boom", "attempts": [{"outcome": "unknown"}]},
            "error: failed: boom. onceflow has retried it",
        ),
    ],
)
def test_what_the_openai_model_reads_per_outcome(step: dict[str, Any], reads: str) -> None:
    assert _output(told_about_step(step)).startswith(reads)
