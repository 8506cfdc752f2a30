"""Payments on real servers: the local Stripe-compatible provider over HTTP, the official
``stripe`` SDK, the Temporal dev server and PostgreSQL. Nothing is mocked.

Every test gets its own provider (fresh ledger and request log, ephemeral port) and its
own task queue; assertions read the provider's ledger, not only the task's result.
"""

import asyncio
import os
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from datetime import timedelta
from typing import Any
from unittest import mock

import psycopg
import pytest
from onceflow_devstack.stripe_provider import (
    ProviderConfig,
    ProviderControl,
    RunningProvider,
    running_provider,
)
from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.activities import builtin_tools
from onceflow.configuration import load_configuration
from onceflow.gateway import BoundaryService, GatewaySettings, open_boundary
from onceflow.payments import (
    PaymentToolSettings,
    StripePaymentProvider,
    StripeSettings,
    charge_payment_contract,
    open_stripe_provider,
    payment_tools,
)
from onceflow.retry_policy import OutcomeClass, RetryBudget
from onceflow.settings import OnceflowSettings
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient
from onceflow.tools import Tool
from onceflow.tools.worker import (
    Catalogue,
    ToolCallInput,
    ToolPolicy,
    derive_task_workflow_id,
    tool_activities,
)
from onceflow.worker import build_worker
from onceflow.workflows.task_models import AgentTaskInput, StepInput
from tests.harness import (
    HANG_SECONDS,
    REPO,
    attempt_environment,
    onceflow_command,
    wait_for,  # noqa: F401 - re-exported for the tests
)

API_KEY = "sk_test_onceflow_payments"
ACCOUNT = "acct_onceflow_test"
TENANT = "acme"
VISA_CHARGE: dict[str, Any] = {
    "amount": 4200,
    "currency": "eur",
    "customer": "cus_alice",
    "payment_method": "pm_card_visa",
    "order_id": "ord-1001",
}


def order(name: str) -> dict[str, Any]:
    """``VISA_CHARGE`` for an order of its own, named ``name`` and a random suffix."""
    return {**VISA_CHARGE, "order_id": f"ord-{name}-{uuid.uuid4().hex[:6]}"}


async def charge_intents(control: ProviderControl) -> list[str]:
    """The PaymentIntent ids the provider's ledger holds charges for, oldest first."""
    return [entry.object_id for entry in await control.ledger() if entry.kind == "charge"]


def one_order(workflow_id: str) -> dict[str, Any]:
    """``VISA_CHARGE`` for an order of its own: each task's charge is its own intent
    (the same order, amount and currency would be one intent, charged once)."""
    return {**VISA_CHARGE, "order_id": f"ord-{workflow_id}"[:64]}


FAST_BUDGET = RetryBudget(
    max_attempts_per_task=6,
    max_attempts_per_step=3,
    initial_backoff=timedelta(milliseconds=50),
    max_backoff=timedelta(milliseconds=200),
    deadline=timedelta(minutes=2),
)
"""Three attempts per step, milliseconds apart: budget decisions without waiting."""

CHARGE_PAYMENT, REFUND_PAYMENT = payment_tools(PaymentToolSettings(), StripeSettings())
"""The payment tools under the default settings, as every worker registers them."""
SHORT_RETENTION_CHARGE = replace(
    CHARGE_PAYMENT,
    contract=charge_payment_contract(
        PaymentToolSettings(
            key_retention=timedelta(milliseconds=500),
            retention_margin=timedelta(milliseconds=100),
            settle_time=timedelta(seconds=2.5),
            attempt_timeout=timedelta(seconds=10),
        ),
        name="charge_payment_short_key_retention",
    ),
)
"""``charge_payment`` at a provider that keeps keys for half a second, so a first attempt
that took a one-second client timeout is already older than the key's retention, and
may still act on a request 2.5 s after the attempt that sent it ended."""


def stripe_settings(base_url: str, **overrides: Any) -> StripeSettings:
    """Settings for a worker's Stripe client pointed at the local provider."""
    values: dict[str, Any] = {
        "api_key": API_KEY,
        "api_base": base_url,
        "account": ACCOUNT,
        # The provider is served in the test's own event loop: on a loaded machine a
        # connect may wait for that loop longer than half a second (no test needs a
        # connect to time out; a stopped provider refuses at once).
        "connect_timeout": timedelta(seconds=5),
        "request_timeout": timedelta(seconds=1),
        **overrides,
    }
    return StripeSettings(**values)


@pytest.fixture
async def provider() -> AsyncIterator[RunningProvider]:
    """A fresh local Stripe-compatible provider served in the test's event loop."""
    async with running_provider(ProviderConfig()) as running:
        yield running


@pytest.fixture
async def control(provider: RunningProvider) -> AsyncIterator[ProviderControl]:
    """Faults, configuration, ledger and request log of the test's provider."""
    async with ProviderControl(provider.base_url) as client:
        yield client


@pytest.fixture
async def payment_provider(provider: RunningProvider) -> AsyncIterator[StripePaymentProvider]:
    """onceflow's Stripe provider (the real SDK over HTTP) pointed at the test's provider."""
    async with open_stripe_provider(stripe_settings(provider.base_url)) as opened:
        assert opened is not None
        yield opened


@pytest.fixture
async def pool(database: str) -> AsyncIterator[AsyncConnectionPool]:
    async with build_pool(database) as opened:
        yield opened


PAYMENT_TOOLS: tuple[Tool, ...] = (CHARGE_PAYMENT, REFUND_PAYMENT, SHORT_RETENTION_CHARGE)
"""What the test worker serves: the payment tools and the test-only variant."""


@pytest.fixture
async def worker(
    dev_server: WorkflowEnvironment,
    pool: AsyncConnectionPool,
    payment_provider: StripePaymentProvider,
    task_queue: str,
) -> AsyncIterator[Worker]:
    """A worker built by onceflow's one composition point, its payment tools talking to
    the test's provider."""
    settings = OnceflowSettings(task_queue=task_queue, shutdown_grace_seconds=1)
    async with payment_worker(dev_server.client, pool, payment_provider, settings) as running:
        yield running


def payment_worker(
    client: Client,
    pool: AsyncConnectionPool,
    payment_provider: StripePaymentProvider,
    settings: OnceflowSettings,
) -> AbstractAsyncContextManager[Worker]:
    """onceflow's worker as its one composition point builds it, serving ``PAYMENT_TOOLS``
    against the test's provider."""
    return build_worker(
        client,
        pool,
        settings,
        tools=PAYMENT_TOOLS,
        clients={tool.name: payment_provider for tool in PAYMENT_TOOLS},
    )


@pytest.fixture
def tasks(dev_server: WorkflowEnvironment, task_queue: str) -> TaskClient:
    """The operators' and the boundary's client for tasks on the test's queue."""
    return TaskClient(dev_server.client, task_queue=task_queue)


async def start_task(
    tasks: TaskClient,
    *steps: tuple[str, str, dict[str, Any]],
    budget: RetryBudget = FAST_BUDGET,
) -> str:
    """Start a task of ``(step_id, tool, arguments)`` steps; returns its workflow id."""
    task = AgentTaskInput(
        tenant=TENANT,
        principal="agent-7",
        steps=[StepInput(step_id=sid, tool=tool, arguments=args) for sid, tool, args in steps],
        budget=budget,
    )
    workflow_id = derive_task_workflow_id(
        tenant=TENANT, scope="task", idempotency_key=f"client-key-{uuid.uuid4().hex}"
    )
    await tasks.start(task, workflow_id=workflow_id)
    return workflow_id


def operation_row(database: str, child_key: str) -> tuple[Any, ...] | None:
    """``(state, resource_id, request id, result)`` of one operations row; the request id
    is the one that made the effect (the original request's when Stripe replayed it), as
    recorded among the operation's correlation ids."""
    with psycopg.connect(database) as conn:
        return conn.execute(
            "SELECT state, resource_id, coalesce(correlation->>'original_request_id', "
            "correlation->>'request_id'), result FROM operations WHERE child_key = %s",
            (child_key,),
        ).fetchone()


READY = "onceflow worker ready"

WorkerProcess = Callable[..., Awaitable[asyncio.subprocess.Process]]
AdmittingClient = Callable[..., TaskClient]


@pytest.fixture
def process_environment(
    dev_server: WorkflowEnvironment, database: str, task_queue: str, provider: RunningProvider
) -> dict[str, str]:
    """The environment of the test's onceflow processes: payments pointed at the provider."""
    return {
        **os.environ,
        "TEMPORAL_ADDRESS": dev_server.client.service_client.config.target_host,
        "DATABASE_URL": database,
        "ONCEFLOW_TASK_QUEUE": task_queue,
        "ONCEFLOW_SHUTDOWN_GRACE_SECONDS": "1",
        "STRIPE_API_BASE": provider.base_url,
        "STRIPE_API_KEY": API_KEY,
        "ONCEFLOW_BUILTIN_TOOLS": "charge_payment,refund_payment",
        "ONCEFLOW_STRIPE_ACCOUNT": ACCOUNT,
        "ONCEFLOW_STRIPE_CONNECT_TIMEOUT": "PT0.5S",
        "ONCEFLOW_STRIPE_REQUEST_TIMEOUT": "PT1S",
        # Short, so the server gives up on the killed worker's attempt quickly.
        "ONCEFLOW_PAYMENTS_ATTEMPT_TIMEOUT": "PT4S",
    }


@pytest.fixture
def admitting(
    dev_server: WorkflowEnvironment, task_queue: str, process_environment: dict[str, str]
) -> AdmittingClient:
    """``admitting(**settings)``: a ``TaskClient`` that admits tasks as a gateway set like
    ``worker_process(**settings)`` would: each task carries the payment tools' policies
    those settings give (the admitting process pins them, never the worker)."""

    def client(**settings: str) -> TaskClient:
        with mock.patch.dict(os.environ, {**process_environment, **settings}, clear=True):
            configuration = load_configuration()
        tools = builtin_tools(configuration)
        catalogue = Catalogue(tuple(tool.registered_contract for tool in tools))
        return TaskClient(dev_server.client, task_queue=task_queue, catalogue=catalogue)

    return client


@pytest.fixture
async def worker_process(process_environment: dict[str, str]) -> AsyncIterator[WorkerProcess]:
    """Starts ready ``onceflow worker`` processes with payments pointed at the provider."""
    environment = process_environment
    started: list[tuple[asyncio.subprocess.Process, asyncio.Task[None]]] = []

    async def start(**settings: str) -> asyncio.subprocess.Process:
        """Start a worker; ``settings`` are more environment variables for it."""
        process = await asyncio.create_subprocess_exec(
            *onceflow_command("worker"),
            cwd=REPO,
            env={**environment, **settings},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        ready = asyncio.Event()
        seen: list[str] = []

        async def read_output() -> None:
            # Keeps draining, so a chatty worker never blocks on a full pipe.
            assert process.stdout is not None
            async for raw in process.stdout:
                seen.append(raw.decode(errors="replace").rstrip())
                if READY in seen[-1]:
                    ready.set()

        reader = asyncio.create_task(read_output())
        started.append((process, reader))
        try:
            await asyncio.wait_for(ready.wait(), timeout=HANG_SECONDS)
        except TimeoutError:
            raise AssertionError("worker never became ready:\n" + "\n".join(seen)) from None
        return process

    yield start
    for process, reader in started:
        if process.returncode is None:
            process.send_signal(signal.SIGCONT)  # a test that failed while it was paused
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), timeout=HANG_SECONDS)
            except TimeoutError:
                process.kill()
                await process.wait()
        reader.cancel()


def queue_boundary(
    dev_server: WorkflowEnvironment, database: str, task_queue: str
) -> AbstractAsyncContextManager[BoundaryService]:
    """An in-process boundary (the gateway's service) on the test's task queue."""
    return open_boundary(
        OnceflowSettings(task_queue=task_queue),
        GatewaySettings(),
        database_url=database,
        temporal_address=dev_server.client.service_client.config.target_host,
    )


def policy_of(tool: str) -> ToolPolicy:
    """The policy a task carries for ``tool`` (its contract's), as the workflow hands it
    to every attempt."""
    [found] = [candidate for candidate in PAYMENT_TOOLS if candidate.name == tool]
    return found.registered_contract.policy()


def step_call(
    workflow_id: str, step_id: str, tool: str, arguments: dict[str, Any]
) -> ToolCallInput:
    """The first attempt of one step of a task, as the workflow hands it to the tool."""
    return ToolCallInput(
        tenant=TENANT,
        principal="agent-7",
        workflow_id=workflow_id,
        step_id=step_id,
        tool=tool,
        arguments=arguments,
        attempt=1,
        policy=policy_of(tool),
    )


Charge = Callable[..., Awaitable[str]]
"""``await charge(workflow_id, **arguments)``: see the ``charge`` fixture."""


@pytest.fixture
async def charge(
    payment_provider: StripePaymentProvider, pool: AsyncConnectionPool
) -> AsyncIterator[Charge]:
    """``await charge(workflow_id)``: step ``pay`` of that task charges, as a worker's
    ``charge_payment`` attempt does; returns its PaymentIntent id."""
    perform = tool_activities(CHARGE_PAYMENT, pool, payment_provider)[0]

    async def run(workflow_id: str, **arguments: Any) -> str:
        done = await attempt_environment().run(
            perform,
            step_call(
                workflow_id, "pay", "charge_payment", {**one_order(workflow_id), **arguments}
            ),
        )
        assert done.outcome is OutcomeClass.SUCCEEDED, done.reason
        return str(done.resource_id)

    yield run
