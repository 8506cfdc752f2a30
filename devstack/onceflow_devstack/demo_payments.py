"""The payments part of ``onceflow demo``: two charges the local provider makes go wrong.

First Stripe charges the card and the answer is lost on the way back; the workflow
repeats the call with the same derived ``Idempotency-Key`` and Stripe replays the first
charge, so the customer pays once. Then Stripe charges, answers 500 and stores that 500
under the key (one same-key repeat shows it replayed), while its read API fails and its
search index lags: no repeat can learn the truth and no read can prove anything, so the
task parks and prints the exact ``onceflow reconcile`` command for a person.

Needs the *local* provider (its fault injection and ledger), never real Stripe.
"""

import asyncio
import uuid
from datetime import timedelta

from rich.console import Console

from onceflow.retry_policy import RetryBudget
from onceflow.task_api import TaskClient
from onceflow.tools.worker import derive_task_workflow_id, key_digest
from onceflow.workflows.task_models import AgentTaskInput, StepInput, TaskState, TaskStatus
from onceflow_devstack.stripe_provider import Fault, LedgerEntry, ProviderControl, RequestRecord

DEMO_BUDGET = RetryBudget(
    max_attempts_per_task=6,
    max_attempts_per_step=3,
    initial_backoff=timedelta(milliseconds=200),
    max_backoff=timedelta(seconds=1),
)
"""Three attempts per step, at most a second apart, so the demo does not wait long."""


async def payments_scenario(
    console: Console,
    client: TaskClient,
    provider_base_url: str,
    *,
    tenant: str = "acme",
    ui_url: str | None = None,
    first_section: int = 5,
) -> None:
    """Show a charge whose response is dropped (one charge) and one that parks.

    Args:
        console: Where to explain.
        client: Starts and reads tasks on the stack's task queue.
        provider_base_url: The local Stripe-compatible provider the stack's worker uses.
        tenant: Tenant of the demo tasks.
        ui_url: The Temporal Web UI, to link the parked task; None prints no link.
        first_section: Number of the first section heading (the demo's earlier parts
            are numbered before it).
    """
    async with ProviderControl(provider_base_url) as provider:
        await _lost_response(console, client, provider, tenant, first_section)
        await _parked_charge(console, client, provider, tenant, ui_url, first_section + 1)


async def _lost_response(
    console: Console, client: TaskClient, provider: ProviderControl, tenant: str, section: int
) -> None:
    console.rule(f"{section}. The agent charges a card; Stripe charges it, the answer is lost")
    await provider.add_fault(Fault.DROP_AFTER_COMMIT, path_prefix="/v1/payment_intents")
    try:
        workflow_id = await _start_charge(client, tenant, amount=2500)
        status = await client.result(workflow_id)
    finally:
        await provider.clear_faults()
    _show_attempts(console, status)
    charges, posts = await _at_the_provider(provider, workflow_id)
    for record in posts:
        console.print(
            f"  POST {record.path}  Idempotency-Key {key_digest(record.idempotency_key or '')}"
            f"  → {record.outcome}",
            highlight=False,
        )
    console.print(
        f"The retry sent the same derived key, Stripe replayed the first answer: "
        f"[bold]{len(charges)}[/] charge for this task "
        f"({', '.join(f'{c.object_id} {c.amount / 100:.2f} {c.currency}' for c in charges)}).",
        soft_wrap=True,
    )


async def _parked_charge(
    console: Console,
    client: TaskClient,
    provider: ProviderControl,
    tenant: str,
    ui_url: str | None,
    section: int,
) -> None:
    console.rule(f"{section}. Stripe charges, answers 500, its reads fail and its search lags")
    await provider.configure(search_lag_seconds=3600)
    await provider.add_fault(Fault.ERROR_500_AFTER_COMMIT, path_prefix="/v1/payment_intents")
    await provider.add_fault(
        Fault.ERROR_503, method="GET", path_prefix="/v1/payment_intents", times=None
    )
    try:
        workflow_id = await _start_charge(client, tenant, amount=9900)
        status = await _until_parked(client, workflow_id)
    finally:
        await provider.clear_faults()
        await provider.configure(search_lag_seconds=0)
    _show_attempts(console, status)
    step = status.step("pay")
    charges, posts = await _at_the_provider(provider, workflow_id)
    console.print(
        f"Stripe stores the 500 under the key and replays it ({len(posts)} POSTs, outcomes "
        f"{', '.join(record.outcome for record in posts)}); the customer's PaymentIntents "
        "could not be listed and search found nothing yet. Nothing more is sent: the task "
        "is [bold]parked[/].",
        soft_wrap=True,
    )
    console.print(f"  reason:   {step.park_reason}", highlight=False, soft_wrap=True)
    names = ("child_key_digest", "request_id", "http_status", "replayed", "lookup_list")
    for name in (*names, "lookup_search"):
        if name in step.evidence:
            console.print(f"  {name}: {step.evidence[name]}", highlight=False, soft_wrap=True)
    console.print("\nThe task tells the operator how to decide:")
    console.print(f"  {step.reconcile_command}", highlight=False, soft_wrap=True)
    if charges:
        console.print(
            "The provider's ledger (your Stripe dashboard) shows the charge, so here that is:"
        )
        console.print(
            f"  onceflow reconcile {workflow_id} --step pay --decision happened "
            f"--resource-id {charges[0].object_id} --reason 'found in the Stripe dashboard'",
            highlight=False,
            soft_wrap=True,
        )
    if ui_url is not None:
        console.print(
            f"Parked task in the UI: {ui_url}/namespaces/default/workflows/{workflow_id}",
            soft_wrap=True,
        )


async def _start_charge(client: TaskClient, tenant: str, *, amount: int) -> str:
    order = f"ord-{uuid.uuid4().hex[:6]}"
    task = AgentTaskInput(
        tenant=tenant,
        principal="checkout-agent",
        steps=[
            StepInput(
                step_id="pay",
                tool="charge_payment",
                arguments={
                    "amount": amount,
                    "currency": "eur",
                    "customer": "cus_demo",
                    "payment_method": "pm_card_visa",
                    "order_id": order,
                },
            )
        ],
        budget=DEMO_BUDGET,
    )
    workflow_id = derive_task_workflow_id(
        tenant=tenant, scope="task", idempotency_key=f"checkout-{order}"
    )
    await client.start(task, workflow_id=workflow_id)
    return workflow_id


async def _until_parked(client: TaskClient, workflow_id: str) -> TaskStatus:
    for _ in range(600):
        status = await client.status(workflow_id)
        if status.state in (TaskState.PARKED, TaskState.SUCCEEDED, TaskState.FAILED):
            return status
        await asyncio.sleep(0.1)
    raise TimeoutError(f"task {workflow_id} did not park within a minute")


async def _at_the_provider(
    provider: ProviderControl, workflow_id: str
) -> tuple[list[LedgerEntry], list[RequestRecord]]:
    """This task's charges in the ledger, and the POSTs that carried their key."""
    charges = [
        entry
        for entry in await provider.ledger()
        if entry.metadata.get("onceflow_workflow_id") == workflow_id
    ]
    keys = {entry.idempotency_key for entry in charges}
    posts = [
        record
        for record in await provider.requests()
        if record.method == "POST" and record.idempotency_key in keys
    ]
    return charges, posts


def _show_attempts(console: Console, status: TaskStatus) -> None:
    step = status.step("pay")
    attempts = ", ".join(attempt.outcome.value for attempt in step.attempts)
    console.print(
        f"  pay  charge_payment  {step.state.value:<10} attempts: {attempts:<28} "
        f"resource: {step.resource_id}",
        highlight=False,
    )
    console.print(f"  task state: [bold]{status.state.value}[/]")
