"""The scripted scenario ``onceflow demo --agent`` shows, on a running stack.

The shop takes an order (a charge through onceflow), the local Stripe-compatible
provider is told to refund and then answer 500, and the support agent runs with the
scripted model: its refund parks, the run ends with deferred tool requests, the operator
finds the refund in the provider's ledger and runs ``onceflow reconcile``, the run
resumes, the model asks for the same refund again (answered ``already done``), the
email's answer is lost on the way back (asked again with its key), and the model answers.
Then what reached the far sides: one refund, one email.

Needs the dev stack (``onceflow_devstack``) for the provider's fault injection: it is a
demonstration, never production code.
"""

import asyncio
import os
import shlex
import sys
import uuid
from collections.abc import Callable
from typing import Any

import httpx
from onceflow_client import OnceflowClient
from onceflow_client.pydantic_ai import WaitingCall

from support_agent.agent import Event, LoseFirstAnswer, describe, run_support_agent
from support_agent.shop import Order, checkout

Say = Callable[[str], None]


async def scripted_demo(
    *,
    gateway_url: str,
    api_key: str,
    database_url: str,
    provider_url: str,
    temporal_address: str,
    task_queue: str,
    sink_control_url: str | None,
    say: Say,
    section: Callable[[str], None],
) -> None:
    """Run the scenario on a stack whose worker serves ``look_up_order`` and whose
    payment tools use the local provider at ``provider_url``; ``api_key`` is a principal
    allowed charge_payment, look_up_order, refund_payment and send_email that may decide."""
    from onceflow_devstack.stripe_provider import Fault, ProviderControl

    section("1. The shop takes an order")
    customer = f"ada-{uuid.uuid4().hex[:6]}@example.com"
    async with OnceflowClient(gateway_url, api_key=api_key) as shop:
        order = await checkout(shop, database_url, customer_email=customer, amount=2500)
    say(
        f"order {order.order_id}: {order.item} for {order.amount / 100:.2f} "
        f"{order.currency.upper()}, paid by {order.payment_intent}, customer {customer}"
    )

    section("2. The customer writes in; the support agent (a scripted model) handles it")
    say(
        "The provider will refund, then answer 500 and keep that answer under the key, "
        "and its refunds cannot be read back: no repeat and no look-up can learn what "
        "happened."
    )
    async with ProviderControl(provider_url) as provider:
        await provider.add_fault(Fault.ERROR_500_AFTER_COMMIT, path_prefix="/v1/refunds")
        await provider.add_fault(
            Fault.ERROR_503, method="GET", path_prefix="/v1/refunds", times=None
        )
        try:

            async def operator(waiting: list[WaitingCall]) -> None:
                await _play_the_operator(
                    waiting, order, provider, temporal_address, task_queue, say, section
                )

            def report(event: Event) -> None:
                say(describe(event))

            async with OnceflowClient(
                gateway_url, api_key=api_key, transport=LoseFirstAnswer("send_email", report)
            ) as agent:
                await run_support_agent(agent, order.order_id, report=report, when_waiting=operator)
        finally:
            await provider.clear_faults()

        section("4. What reached the far sides")
        refunds = [
            entry
            for entry in await provider.ledger()
            if entry.kind == "refund" and entry.payment_intent == order.payment_intent
        ]
    say(
        f"refunds of {order.payment_intent} at the provider: {len(refunds)} "
        f"({', '.join(f'{r.object_id} {r.amount / 100:.2f}' for r in refunds)})"
    )
    if sink_control_url is not None:
        emails = await _delivered(sink_control_url, customer)
        say(
            f"emails to {customer} at the SMTP sink: {len(emails)} "
            f"({', '.join(str(m.get('subject')) for m in emails)})"
        )


async def _play_the_operator(
    waiting: list[WaitingCall],
    order: Order,
    provider: Any,
    temporal_address: str,
    task_queue: str,
    say: Say,
    section: Callable[[str], None],
) -> None:
    section("3. A person decides")
    await provider.clear_faults()  # the provider's reads are back
    for call in waiting:
        if call.state != "parked":
            continue
        refunds = [
            entry
            for entry in await provider.ledger()
            if entry.kind == "refund" and entry.payment_intent == order.payment_intent
        ]
        if not refunds:
            say("The provider's ledger shows no refund: deciding did_not_happen would be right.")
            continue
        command = [
            "onceflow",
            "reconcile",
            call.task_id,
            "--step",
            call.step_id,
            "--decision",
            "happened",
            "--resource-id",
            refunds[0].object_id,
            "--reason",
            "the refund is in the Stripe dashboard",
        ]
        say(f"The Stripe dashboard (the provider's ledger) shows {refunds[0].object_id}, so:")
        say(f"$ {shlex.join(command)}")
        # A subprocess of our own loop's stack: waiting on it must not block the loop.
        ran = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "onceflow.cli",
            *command[1:],
            env={
                **os.environ,
                "TEMPORAL_ADDRESS": temporal_address,
                "ONCEFLOW_TASK_QUEUE": task_queue,
            },
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await ran.communicate()
        say(output.decode(errors="replace").strip())
        if ran.returncode != 0:
            raise RuntimeError(f"onceflow reconcile failed ({ran.returncode})")
    say("The agent waits for the decision, then resumes the run with it:")


async def _delivered(control_url: str, recipient: str) -> list[dict[str, Any]]:
    """The sink's messages to ``recipient`` once the relay delivered one (at most 15 s)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    async with httpx.AsyncClient(base_url=control_url, timeout=5) as sink:
        while True:
            received = (await sink.get("/messages")).json()["received"]
            emails = [m for m in received if m["applied"] and recipient in m["rcpt_tos"]]
            if emails or loop.time() > deadline:
                return emails
            await asyncio.sleep(0.2)  # the relay polls its outbox; look again shortly
