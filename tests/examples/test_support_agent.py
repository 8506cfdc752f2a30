"""The support_agent example end to end, offline, as its README runs it.

The example package is installed (offline, into a private folder) like any third-party
package. A worker and a gateway process find its ``look_up_order`` tool through the
``onceflow.tools`` entry point because ``ONCEFLOW_TOOLS=support_agent``; the payment tools
reach the local Stripe-compatible provider, and a relay delivers email to an SMTP sink.
The shop's checkout (``python -m support_agent.shop``) places an order, the provider is
told to refund and then answer 500, and the agent (``python -m support_agent``, scripted
model) runs: its refund parks, it prints what a person must decide, the test plays the
operator with ``onceflow reconcile``, and the run resumes to the model's final answer.
The far sides must hold one refund and one email.
"""

import asyncio
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from onceflow_devstack.smtp_sink import RunningSink, running_smtp_sink
from onceflow_devstack.stripe_provider import (
    Fault,
    ProviderConfig,
    ProviderControl,
    running_provider,
)
from temporalio.testing import WorkflowEnvironment

from onceflow.email import OutboxRelay
from onceflow.storage import build_pool
from tests.email.conftest import email_settings
from tests.gateway.conftest import Caller, make_caller, new_tenant
from tests.harness import (
    HANG_SECONDS,
    REPO,
    eventually,
    log_line,
    onceflow_command,
    replay_tools_from,
    settled_count,
)

EXAMPLE = REPO / "examples" / "support_agent"
AGENT_TOOLS = ("look_up_order", "refund_payment", "send_email")


@dataclass(frozen=True)
class Shop:
    """The running example: onceflow processes with its tool, far sides, principals."""

    gateway_url: str
    env: dict[str, str]
    """What the example's own commands and the operator's CLI need."""
    provider: ProviderControl
    sink: RunningSink
    checkout: Caller
    support: Caller
    temporal: WorkflowEnvironment
    workdir: Path

    async def run(self, *arguments: str) -> asyncio.subprocess.Process:
        """Start ``python <arguments>`` with the example installed, outside the repository."""
        return await asyncio.create_subprocess_exec(
            sys.executable,
            *arguments,
            cwd=self.workdir,
            env={**os.environ, **self.env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )


def install_example(into: Path) -> Path:
    """Install the example offline into ``into/site`` from a copy of its sources."""
    source = into / "src"
    shutil.copytree(
        EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    site = into / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(site),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert list(site.glob("onceflow_example_support_agent-*.dist-info/entry_points.txt"))
    return site


@pytest.fixture(scope="module")
async def shop(
    postgres_url: str, dev_server: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Shop]:
    root = tmp_path_factory.mktemp("support-agent")
    site = install_example(root)
    replay_tools_from(site, "support_agent")  # its tasks replay at the end of the run
    python_path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    temporal_address = dev_server.client.service_client.config.target_host
    processes: list[subprocess.Popen[bytes]] = []
    async with (
        running_provider(ProviderConfig()) as provider,
        ProviderControl(provider.base_url) as control,
        running_smtp_sink() as sink,
        build_pool(postgres_url, max_size=2) as pool,
    ):
        relay = OutboxRelay(pool, email_settings(sink.smtp_url))
        stop_relay = asyncio.Event()
        relaying = asyncio.create_task(relay.run(stop_relay))
        env = {
            "PYTHONPATH": python_path,
            "PYTHONUNBUFFERED": "1",
            "DATABASE_URL": postgres_url,
            "TEMPORAL_ADDRESS": temporal_address,
            "ONCEFLOW_TASK_QUEUE": f"support-{uuid.uuid4().hex[:8]}",
            # Never join services a developer's own `onceflow dev` left recorded.
            "ONCEFLOW_STATE_DIR": str(root / "state"),
            "ONCEFLOW_SHUTDOWN_GRACE_SECONDS": "2",
            "ONCEFLOW_TOOLS": "support_agent",
            "ONCEFLOW_BUILTIN_TOOLS": "charge_payment,refund_payment,send_email",
            "STRIPE_API_KEY": "sk_test_support_agent",
            "STRIPE_API_BASE": provider.base_url,
        }
        try:
            for name, command in (
                ("worker", onceflow_command("worker")),
                ("gateway", onceflow_command("gateway", "--port", "0")),
            ):
                log = root / f"{name}.log"
                with log.open("wb") as stream:
                    processes.append(
                        subprocess.Popen(
                            command,
                            cwd=REPO,
                            env={**os.environ, **env},
                            stdout=stream,
                            stderr=subprocess.STDOUT,
                        )
                    )
            await log_line(processes[0], root / "worker.log", "onceflow worker ready")
            ready = await log_line(processes[1], root / "gateway.log", "gateway ready on ")
            tenant = new_tenant()
            yield Shop(
                gateway_url=ready.split("gateway ready on ", 1)[1].split()[0],
                env=env,
                provider=control,
                sink=sink,
                checkout=await make_caller(
                    postgres_url,
                    tenant=f"{tenant}-shop",
                    name="checkout",
                    tools=("charge_payment",),
                ),
                support=await make_caller(
                    postgres_url, tenant=tenant, name="support-agent", tools=AGENT_TOOLS
                ),
                temporal=dev_server,
                workdir=root,
            )
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(timeout=HANG_SECONDS)
                except subprocess.TimeoutExpired:
                    process.kill()
            stop_relay.set()
            await asyncio.wait_for(relaying, timeout=HANG_SECONDS)


async def test_the_scripted_agent_parks_is_reconciled_and_refunds_and_emails_once(
    shop: Shop,
) -> None:
    customer = f"ada-{uuid.uuid4().hex[:6]}@example.com"
    placed = await shop.run(
        "-m",
        "support_agent.shop",
        "--gateway",
        shop.gateway_url,
        "--api-key",
        shop.checkout.api_key,
        "--customer-email",
        customer,
        "--amount",
        "2500",
    )
    out, err = await asyncio.wait_for(placed.communicate(), timeout=60)
    assert placed.returncode == 0, err.decode()
    order = json.loads(out)
    # Stripe refunds, answers 500 and keeps that answer under the key, and its refunds
    # cannot be read back: the refund parks.
    await shop.provider.add_fault(Fault.ERROR_500_AFTER_COMMIT, path_prefix="/v1/refunds")
    await shop.provider.add_fault(
        Fault.ERROR_503, method="GET", path_prefix="/v1/refunds", times=None
    )

    agent = await shop.run(
        "-m",
        "support_agent",
        "--gateway",
        shop.gateway_url,
        "--api-key",
        shop.support.api_key,
        "--order",
        order["order_id"],
        "--decision-timeout",
        "60",
        "--json",
    )
    try:
        events = await _events_until(agent, "waiting")
        waiting = events[-1]
        assert (waiting["tool"], waiting["state"], waiting["needs_person"]) == (
            "refund_payment",
            "parked",
            True,
        )
        assert waiting["reconcile_command"].startswith(f"onceflow reconcile {waiting['task_id']}")
        refunds = await _refunds(shop, order["payment_intent"])
        assert len(refunds) == 1, "the refund happened once, its answer did not arrive"
        await shop.provider.clear_faults()  # the reads are back for the operator's check

        # The operator finds the refund in the Stripe dashboard (the provider's ledger).
        reconcile = await asyncio.create_subprocess_exec(
            *onceflow_command(
                "reconcile",
                waiting["task_id"],
                "--step",
                waiting["step_id"],
                "--decision",
                "happened",
                "--resource-id",
                refunds[0].object_id,
                "--reason",
                "the refund is in the Stripe dashboard",
            ),
            cwd=REPO,
            env={**os.environ, **shop.env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        decided, _ = await asyncio.wait_for(reconcile.communicate(), timeout=60)
        assert reconcile.returncode == 0, decided.decode()

        events += await _events_until(agent, "final")
        await asyncio.wait_for(agent.wait(), timeout=HANG_SECONDS)
    finally:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()
    assert agent.returncode == 0, (await agent.stderr.read()).decode() if agent.stderr else ""

    asked = [
        (event["tool"], event["tool_call_id"]) for event in events if event["event"] == "asked"
    ]
    assert asked == [
        ("look_up_order", "lookup"),
        ("refund_payment", "refund"),
        ("refund_payment", "refund-again"),
        ("send_email", "email"),
    ]
    told = {event["tool_call_id"]: event for event in events if event["event"] == "told"}
    assert told["refund"]["content"]["refund"] == refunds[0].object_id
    assert told["refund-again"]["repeat"], "the repeat guard answered the second refund"
    assert [event["tool"] for event in events if event["event"] == "lost"] == ["send_email"]
    [done] = [event for event in events if event["event"] == "onceflow"]
    calls = {call["step_id"]: call for call in done["calls"]}
    assert calls["refund-again"]["repeat_of"] == "refund" and not calls["refund-again"]["attempts"]
    assert all(call["state"] == "succeeded" for call in calls.values())
    final = events[-1]
    assert final["output"] == (
        f"Refunded 25.00 USD for order {order['order_id']} (refund {refunds[0].object_id}) "
        f"and emailed {customer}."
    )

    assert len(await _refunds(shop, order["payment_intent"])) == 1
    emails = await eventually(
        lambda: [m for m in shop.sink.sink.received if m.applied and customer in m.rcpt_tos],
        what=f"the email to {customer} reached the SMTP sink",
    )
    assert len(emails) == 1 and refunds[0].object_id in emails[0].body
    tenant = shop.support.principal.tenant
    tasks = await settled_count(
        shop.temporal.client,
        f"WorkflowType = 'AgentTaskWorkflow' AND OnceflowTenant = '{tenant}'",
    )
    assert tasks == 1, "the whole conversation, paused and resumed, was one open task"


async def _events_until(process: asyncio.subprocess.Process, kind: str) -> list[dict[str, Any]]:
    """The agent's JSON events up to and including the first of ``kind``."""
    assert process.stdout is not None
    events: list[dict[str, Any]] = []
    while not events or events[-1]["event"] != kind:
        line = await asyncio.wait_for(process.stdout.readline(), timeout=60)
        if not line:
            stderr = await process.stderr.read() if process.stderr else b""
            raise AssertionError(f"the agent exited before {kind!r}: {events}\n{stderr.decode()}")
        events.append(json.loads(line))
    return events


async def _refunds(shop: Shop, payment_intent: str) -> list[Any]:
    return [
        entry
        for entry in await shop.provider.ledger()
        if entry.kind == "refund" and entry.payment_intent == payment_intent
    ]
