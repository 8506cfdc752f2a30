"""The real stack agent frameworks drive, shared by every adapter's tests.

One stack per test module: PostgreSQL and the Temporal dev server (session fixtures), a
worker in this process serving the built-in tools with the payment tools pointed at the
local Stripe-compatible provider, an outbox relay delivering to a local SMTP sink, and one
``onceflow gateway`` process the frameworks reach over HTTP, as an agent runtime would.
Each test gets principals of a tenant of its own (task workflow ids include the tenant),
so tests read their own effects at the far sides without emptying any table:
``agent_stack.far_sides.refunds(payment_intent)``, ``.charges(order_id)``,
``.emails(recipient)``.
"""

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from onceflow_devstack.smtp_sink import ReceivedMessage, RunningSink, running_smtp_sink
from onceflow_devstack.stripe_provider import (
    LedgerEntry,
    ProviderConfig,
    ProviderControl,
    running_provider,
)
from temporalio.testing import WorkflowEnvironment

from onceflow.email import OutboxRelay
from onceflow.storage import build_pool
from tests.email.conftest import email_settings
from tests.gateway.conftest import (
    Caller,
    GatewayProcess,
    Stack,
    make_caller,
    new_tenant,
    serving_stack,
    start_gateway,
    stripe_tools,
)
from tests.harness import HANG_SECONDS, eventually

AGENT_TOOLS = ("issue_coupon", "create_order", "charge_payment", "refund_payment", "send_email")
"""What the agents of these tests may call."""
FAST_BUDGET = {
    "max_attempts_per_task": 8,
    "max_attempts_per_step": 2,
    "initial_backoff": 0.05,
    "max_backoff": 0.2,
}
"""An open task's budget that parks an unknown outcome within a second, not a minute."""


@dataclass(frozen=True)
class FarSides:
    """What the tools reach: the Stripe-compatible provider and the SMTP sink."""

    provider: ProviderControl
    provider_url: str
    sink: RunningSink

    async def charges(self, order_id: str) -> list[LedgerEntry]:
        """PaymentIntents that took money for ``order_id``."""
        return [
            entry
            for entry in await self.provider.ledger()
            if entry.kind == "charge" and entry.metadata.get("order_id") == order_id
        ]

    async def refunds(self, payment_intent: str) -> list[LedgerEntry]:
        """Refunds of one PaymentIntent."""
        return [
            entry
            for entry in await self.provider.ledger()
            if entry.kind == "refund" and entry.payment_intent == payment_intent
        ]

    def emails(self, recipient: str) -> list[ReceivedMessage]:
        """Messages the sink applied (first deliveries) for ``recipient``."""
        return [
            message
            for message in self.sink.sink.received
            if message.applied and recipient in message.rcpt_tos
        ]


@dataclass(frozen=True)
class AgentStack:
    """A gateway over HTTP, its worker and relay, and the far sides they reach."""

    gateway_url: str
    stack: Stack
    far_sides: FarSides
    gateway: GatewayProcess

    async def agent(self, tools: tuple[str, ...] = AGENT_TOOLS) -> Caller:
        """A principal of a fresh tenant, allowed ``tools``."""
        return await make_caller(
            self.stack.postgres_url, tenant=new_tenant(), name="agent", tools=tools
        )

    async def operator(self, agent: Caller) -> Caller:
        """A person of the agent's tenant who may approve and reconcile."""
        return await make_caller(
            self.stack.postgres_url,
            tenant=agent.principal.tenant,
            name="operator",
            tools=(),
            may_decide=True,
        )

    async def approver(self, agent: Caller, name: str = "refund-desk") -> Caller:
        """An app's approval screen in the agent's tenant: may approve, not reconcile."""
        return await make_caller(
            self.stack.postgres_url,
            tenant=agent.principal.tenant,
            name=name,
            tools=(),
            may_approve=True,
        )

    async def task_workflows(self, agent: Caller) -> int:
        """How many tasks the agent's tenant ran (visibility settled first)."""
        return await self.stack.task_workflows(agent.principal.tenant)

    async def reconcile(
        self, operator: Caller, task_id: str, step_id: str, **decision: Any
    ) -> dict[str, Any]:
        """``POST /v1/tasks/{id}/reconcile`` as ``operator``; returns the accepted decision."""
        return await self._decide(operator, f"/v1/tasks/{task_id}/reconcile", step_id, decision)

    async def approve(
        self, operator: Caller, task_id: str, step_id: str, **decision: Any
    ) -> dict[str, Any]:
        """``POST /v1/tasks/{id}/approve`` as ``operator``; returns the accepted decision."""
        return await self._decide(operator, f"/v1/tasks/{task_id}/approve", step_id, decision)

    async def delivered(self, recipient: str, count: int = 1) -> list[ReceivedMessage]:
        """Wait until the relay delivered ``count`` messages to ``recipient``."""
        return await eventually(
            lambda: self.far_sides.emails(recipient),
            until=lambda messages: len(messages) >= count,
            what=f"{count} email(s) to {recipient} reached the SMTP sink",
        )

    async def _decide(
        self, operator: Caller, path: str, step_id: str, decision: dict[str, Any]
    ) -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=self.gateway_url, headers=operator.headers) as http:
            answer = await http.post(path, json={"step_id": step_id, **decision}, timeout=60)
        assert answer.status_code == 200, answer.text
        decided: dict[str, Any] = answer.json()
        return decided


@pytest.fixture(scope="module")
async def far_sides() -> AsyncIterator[FarSides]:
    """The module's Stripe-compatible provider and SMTP sink, in the tests' event loop."""
    async with (
        running_provider(ProviderConfig()) as provider,
        ProviderControl(provider.base_url) as control,
        running_smtp_sink() as sink,
    ):
        yield FarSides(provider=control, provider_url=provider.base_url, sink=sink)


@pytest.fixture(scope="module")
async def agent_stack(
    postgres_url: str,
    dev_server: WorkflowEnvironment,
    far_sides: FarSides,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[AgentStack]:
    """A worker, a relay and a gateway process on the module's far sides."""
    async with (
        serving_stack(
            postgres_url, dev_server, tools=stripe_tools(far_sides.provider_url)
        ) as stack,
        _relay(postgres_url, far_sides.sink),
    ):
        gateway = start_gateway(stack, tmp_path_factory.mktemp("agent-gateway") / "gateway.log")
        try:
            yield AgentStack(
                gateway_url=gateway.url, stack=stack, far_sides=far_sides, gateway=gateway
            )
        finally:
            gateway.stop()


@pytest.fixture
async def behaving_provider(agent_stack: AgentStack) -> AsyncIterator[ProviderControl]:
    """The provider with no fault armed before or after the test (faults it arms go)."""
    control = agent_stack.far_sides.provider
    await control.clear_faults()
    yield control
    await control.clear_faults()


def new_order_id() -> str:
    """An order id no other test uses."""
    return f"ord-{uuid.uuid4().hex[:10]}"


def new_recipient() -> str:
    """An email address no other test writes to."""
    return f"customer-{uuid.uuid4().hex[:8]}@example.com"


@contextlib.asynccontextmanager
async def _relay(database_url: str, sink: RunningSink) -> AsyncIterator[OutboxRelay]:
    async with build_pool(database_url, max_size=2) as pool:
        relay = OutboxRelay(pool, email_settings(sink.smtp_url))
        stop = asyncio.Event()
        running = asyncio.create_task(relay.run(stop))
        try:
            yield relay
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(running, timeout=HANG_SECONDS)
