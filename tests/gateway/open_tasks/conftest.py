"""Open tasks through every transport (HTTP, MCP, the Python client) on one stack a module:
a worker running the built-in tools with the payment tools talking to the module's local
Stripe-compatible provider, whose ledger is the far side the tests read."""

from collections.abc import AsyncIterator

import pytest
from temporalio.testing import WorkflowEnvironment

from ..conftest import (
    Caller,
    Stack,
    StripeProvider,
    make_caller,
    new_tenant,
    serving_stack,
    stripe_tools,
)

TOOLS = ("issue_coupon", "create_order", "charge_payment", "refund_payment")
"""The reference tools an agent of these tests may call."""


@pytest.fixture(scope="module")
async def stack(
    postgres_url: str, dev_server: WorkflowEnvironment, stripe_provider: StripeProvider
) -> AsyncIterator[Stack]:
    """The module's worker, with the payment tools talking to the module's provider."""
    async with serving_stack(
        postgres_url, dev_server, tools=stripe_tools(stripe_provider.base_url)
    ) as served:
        yield served


@pytest.fixture
async def agent(database: str) -> Caller:
    """An agent of a fresh tenant allowed the four reference tools these tests call."""
    return await make_caller(database, tenant=new_tenant(), tools=TOOLS)
