"""What the Nexus tests do on onceflow's side of a caller: serve the Nexus service as a
principal, derive the task a call runs as, park a charge and reconcile it, and replay the
caller application's histories."""

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from onceflow_devstack.stripe_provider import Fault, ProviderControl
from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.plugin import SimplePlugin
from temporalio.worker import Replayer, Worker

from onceflow.gateway import TOOL_CALL_STEP_ID, PrincipalStore
from onceflow.nexus import NexusCaller, NexusPrincipal
from onceflow.payments import StripePaymentProvider
from onceflow.settings import OnceflowSettings
from onceflow.task_api import TaskClient
from onceflow.tools.worker import derive_task_workflow_id
from onceflow.workflows.task_models import ReconcileDecision, ReconcileInput
from tests.harness import eventually
from tests.payments.conftest import payment_worker


@asynccontextmanager
async def serving_nexus(
    client: Client,
    pool: AsyncConnectionPool,
    payment_provider: StripePaymentProvider,
    task_queue: str,
    principal: NexusPrincipal,
    tools: list[str],
) -> AsyncIterator[Worker]:
    """onceflow's worker serving the payment tools and the Nexus service, which acts as
    ``principal`` (created here, allowed ``tools``)."""
    await PrincipalStore(pool).create(tenant=principal.tenant, name=principal.name, tools=tools)
    settings = OnceflowSettings(
        task_queue=task_queue, shutdown_grace_seconds=1, nexus_principal=str(principal)
    )
    async with payment_worker(client, pool, payment_provider, settings) as running:
        yield running


def nexus_task_id(
    principal: NexusPrincipal, namespace: str, caller_id: str, call_id: str, tool: str
) -> str:
    """The onceflow task a caller's call runs as (the handler's derivation)."""
    caller = NexusCaller(namespace=namespace, workflow_id=caller_id, request_id="")
    return derive_task_workflow_id(
        tenant=principal.tenant,
        scope=f"{principal.tenant}:{principal.name}:{tool}:nexus",
        idempotency_key=caller.call_key(call_id),
    )


async def make_charges_unknowable(control: ProviderControl) -> None:
    """Stripe makes a charge but answers 500 (stored under the key), its reads fail and
    its search lags: the step cannot tell, and parks."""
    await control.configure(search_lag_seconds=3600)
    await control.add_fault(Fault.ERROR_500_AFTER_COMMIT, path_prefix="/v1/payment_intents")
    await control.add_fault(
        Fault.ERROR_503, method="GET", path_prefix="/v1/payment_intents", times=None
    )


async def until_parked(tasks: TaskClient, task_id: str, what: str) -> None:
    await eventually(
        lambda: tasks.summary(task_id),
        until=lambda summary: summary is not None and summary.state == "parked",
        what=what,
        timeout=120,
    )


async def reconcile_as_happened(tasks: TaskClient, task_id: str, intent: str) -> None:
    """What `onceflow reconcile TASK --step 1 --decision happened --resource-id` sends."""
    await tasks.reconcile(
        task_id,
        ReconcileInput(
            step_id=TOOL_CALL_STEP_ID,
            decision=ReconcileDecision.HAPPENED,
            resource_id=intent,
            operator="ops@acme",
            reason="found in the dashboard",
        ),
    )


async def replay_caller_histories(
    client: Client, query: str, workflows: Sequence[type], plugin_name: str
) -> int:
    """Replays the caller application's histories ``query`` lists, with its own plugin
    (not onceflow's: its workflows are its own); none may diverge. Returns how many."""
    replayer = Replayer(
        workflows=list(workflows),
        plugins=[SimplePlugin(plugin_name, data_converter=pydantic_data_converter)],
    )
    replayed = 0
    histories = client.list_workflows(query).map_histories()
    async with replayer.workflow_replay_iterator(histories) as replays:
        async for result in replays:
            replayed += 1
            assert result.replay_failure is None, result.replay_failure
    return replayed
