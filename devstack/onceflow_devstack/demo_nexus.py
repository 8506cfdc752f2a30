"""The Nexus part of ``onceflow demo``: an agent that runs as a Temporal workflow of its
own application charges through onceflow's Nexus service.

First Stripe charges and the answer is lost: onceflow repeats under the same derived key,
Stripe replays the first charge, and the agent's operation completes with the one
PaymentIntent. Then the charge cannot be known (a 500 stored under the key, failing reads,
a lagging search) and parks: the agent's workflow just waits on its open operation, no
activity held, until the operator's ``reconcile`` (made here, as a person would after
checking the dashboard); then the agent continues with the PaymentIntent.

Needs the *local* provider (its fault injection and ledger), never real Stripe.
"""

import asyncio
import uuid

from rich.console import Console
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.plugin import SimplePlugin
from temporalio.worker import Worker

from onceflow.gateway import TOOL_CALL_STEP_ID
from onceflow.nexus import DEFAULT_ENDPOINT, NexusCaller, NexusPrincipal
from onceflow.task_api import TaskClient
from onceflow.tools.worker import derive_task_workflow_id
from onceflow.workflows.task_models import (
    ReconcileDecision,
    ReconcileInput,
    TaskState,
    TaskStatus,
)
from onceflow_devstack.nexus_agent import CheckoutAgent, CheckoutInput
from onceflow_devstack.stripe_provider import Fault, ProviderControl

PARK_WAIT_SECONDS = 60.0
"""How long the demo waits for the unknowable charge to park before giving up."""


async def nexus_scenario(
    console: Console,
    tasks: TaskClient,
    provider_base_url: str,
    *,
    temporal_address: str,
    principal: NexusPrincipal,
    endpoint: str = DEFAULT_ENDPOINT,
    ui_url: str | None = None,
    first_section: int = 9,
    data_converter: DataConverter = pydantic_data_converter,
) -> None:
    """Show a Temporal-native agent charging once through a lost answer, and waiting
    through a park until it is reconciled.

    Args:
        console: Where to explain.
        tasks: Reads and decides onceflow's tasks (the operator's side).
        provider_base_url: The local Stripe-compatible provider the stack's worker uses.
        temporal_address: The stack's Temporal, where the agent's application runs too.
        principal: The principal the stack's Nexus service acts as (its tasks' tenant).
        endpoint: The Nexus endpoint to onceflow. Default ``onceflow-tools``.
        ui_url: The Temporal Web UI, to link the agent's workflow; None prints no link.
        first_section: Number of the first section heading.
        data_converter: The agent application's converter: pydantic's, with onceflow's
            codec when the stack encrypts payloads (the operation's result is the task's
            own result payload). Default pydantic's.
    """
    # The agent's application: a client of its own and, on its own task queue, a worker
    # built on it, given the converter and the workflow by the application's plugin.
    client = await Client.connect(
        temporal_address,
        plugins=[
            SimplePlugin(
                "checkout-agents", data_converter=data_converter, workflows=[CheckoutAgent]
            )
        ],
    )
    queue = f"checkout-agents-{uuid.uuid4().hex[:8]}"
    async with (
        ProviderControl(provider_base_url) as provider,
        Worker(client, task_queue=queue),
    ):
        agent = _Agent(client, queue, endpoint, tasks, principal)
        await _lost_answer(console, agent, provider, first_section)
        await _parked_then_reconciled(console, agent, provider, ui_url, first_section + 1)


class _Agent:
    """Starts the agent's workflow and names the onceflow task its call runs as."""

    def __init__(
        self,
        client: Client,
        queue: str,
        endpoint: str,
        tasks: TaskClient,
        principal: NexusPrincipal,
    ) -> None:
        self.client = client
        self.queue = queue
        self.endpoint = endpoint
        self.tasks = tasks
        self.principal = principal

    async def start(self, amount: int) -> tuple[str, str]:
        """Start a checkout; returns the agent's workflow id and its call's task id."""
        workflow_id = f"checkout-agent-{uuid.uuid4().hex[:8]}"
        arguments = {
            "amount": amount,
            "currency": "eur",
            "customer": "cus_demo",
            "payment_method": "pm_card_visa",
            "order_id": f"ord-{uuid.uuid4().hex[:6]}",
        }
        await self.client.start_workflow(
            CheckoutAgent.run,
            CheckoutInput(endpoint=self.endpoint, call_id="charge-1", arguments=arguments),
            id=workflow_id,
            task_queue=self.queue,
        )
        caller = NexusCaller(
            namespace=self.client.namespace, workflow_id=workflow_id, request_id=""
        )
        task_id = derive_task_workflow_id(
            tenant=self.principal.tenant,
            scope=f"{self.principal.tenant}:{self.principal.name}:charge_payment:nexus",
            idempotency_key=caller.call_key("charge-1"),
        )
        return workflow_id, task_id

    async def result(self, workflow_id: str) -> TaskStatus:
        handle = self.client.get_workflow_handle_for(CheckoutAgent.run, workflow_id)
        return await handle.result()


async def _lost_answer(
    console: Console, agent: _Agent, provider: ProviderControl, section: int
) -> None:
    console.rule(
        f"{section}. An agent running on Temporal charges through Nexus; the answer is lost"
    )
    await provider.add_fault(Fault.DROP_AFTER_COMMIT, path_prefix="/v1/payment_intents")
    try:
        workflow_id, task_id = await agent.start(amount=3100)
        status = await agent.result(workflow_id)
    finally:
        await provider.clear_faults()
    step = status.step(TOOL_CALL_STEP_ID)
    attempts = ", ".join(attempt.outcome.value for attempt in step.attempts)
    charges = await _charges(provider, task_id)
    console.print(
        f"The agent's workflow {workflow_id} called OnceflowTools.call_tool; onceflow ran "
        f"it as task {task_id} (attempts: {attempts}). The operation completed with "
        f"{step.resource_id}: [bold]{len(charges)}[/] charge at the provider.",
        soft_wrap=True,
    )


async def _parked_then_reconciled(
    console: Console, agent: _Agent, provider: ProviderControl, ui_url: str | None, section: int
) -> None:
    console.rule(f"{section}. The charge cannot be known: it parks, and the agent waits")
    await provider.configure(search_lag_seconds=3600)
    await provider.add_fault(Fault.ERROR_500_AFTER_COMMIT, path_prefix="/v1/payment_intents")
    await provider.add_fault(
        Fault.ERROR_503, method="GET", path_prefix="/v1/payment_intents", times=None
    )
    try:
        workflow_id, task_id = await agent.start(amount=5400)
        parked = await _until_parked(agent.tasks, task_id)
    finally:
        await provider.clear_faults()
        await provider.configure(search_lag_seconds=0)
    described = await agent.client.get_workflow_handle(workflow_id).describe()
    waiting = described.status is WorkflowExecutionStatus.RUNNING
    console.print(
        f"Task {task_id} is [bold]{parked.state.value}[/]; the agent's workflow is "
        f"{'still running, waiting on its open Nexus operation' if waiting else 'not waiting'}"
        " (no activity held, no model tokens spent).",
        soft_wrap=True,
    )
    if ui_url is not None:
        console.print(
            f"The agent in the UI: {ui_url}/namespaces/default/workflows/{workflow_id}",
            soft_wrap=True,
        )
    charges = await _charges(provider, task_id)
    if parked.state is not TaskState.PARKED or not charges:
        return
    console.print(
        "The operator finds the charge in the Stripe dashboard and decides:\n"
        f"  onceflow reconcile {task_id} --step {TOOL_CALL_STEP_ID} --decision happened "
        f"--resource-id {charges[0]} --reason 'found in the Stripe dashboard'",
        highlight=False,
        soft_wrap=True,
    )
    await agent.tasks.reconcile(
        task_id,
        ReconcileInput(
            step_id=TOOL_CALL_STEP_ID,
            decision=ReconcileDecision.HAPPENED,
            resource_id=charges[0],
            operator="demo-operator",
            reason="found in the Stripe dashboard",
        ),
    )
    status = await agent.result(workflow_id)
    made = await _charges(provider, task_id)
    console.print(
        f"The operation completed; the agent continues with "
        f"{status.step(TOOL_CALL_STEP_ID).resource_id} ({status.state.value}). "
        f"Charges at the provider for this call: [bold]{len(made)}[/].",
        soft_wrap=True,
    )


async def _until_parked(tasks: TaskClient, task_id: str) -> TaskStatus:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PARK_WAIT_SECONDS
    while loop.time() < deadline:
        summary = await tasks.summary(task_id)
        if summary is not None and summary.state in ("parked", "succeeded", "failed"):
            return await tasks.status(task_id)
        await asyncio.sleep(0.1)
    raise TimeoutError(f"task {task_id} did not park within {PARK_WAIT_SECONDS:g} s")


async def _charges(provider: ProviderControl, task_id: str) -> list[str]:
    """The PaymentIntents the provider made for this task."""
    return [
        entry.object_id
        for entry in await provider.ledger()
        if entry.kind == "charge" and entry.metadata.get("onceflow_workflow_id") == task_id
    ]
