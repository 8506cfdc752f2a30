"""Fixtures for the boundary: a worker, gateway processes and principals on the real stack.

One task queue, worker and pair of gateway processes serve a whole test module (each
test still starts from empty tables through ``database``); gateways with special
settings (fault injection) are started by the tests that need them. A module whose
tests charge cards overrides ``stack`` with ``serving_stack(..., tools=stripe_tools(...))``
on the module's ``stripe_provider``, whose ledger is the far side those tests read.
"""

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from onceflow_devstack.stripe_provider import (
    ProviderConfig,
    ProviderControl,
    running_provider,
)
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from onceflow.gateway import (
    BoundaryService,
    GatewaySettings,
    Principal,
    PrincipalStore,
    open_boundary,
)
from onceflow.payments import StripeSettings
from onceflow.settings import OnceflowSettings
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient
from onceflow.tools import Tool
from onceflow.worker import build_worker
from onceflow.workflows.task_models import AgentTaskInput, StepInput
from tests.harness import HANG_SECONDS, log_line_blocking, settled_count
from tests.tool_configuration import builtin

from ..conftest import BUSINESS_TABLES, repo_root

READY = "onceflow gateway ready on "


@dataclass(frozen=True)
class Stack:
    """The embedded stack one module's tests share."""

    postgres_url: str
    temporal_address: str
    task_queue: str
    client: Client

    def env(self, **extra: str) -> dict[str, str]:
        """Environment of a gateway (or MCP) process on this stack."""
        return {
            "DATABASE_URL": self.postgres_url,
            "TEMPORAL_ADDRESS": self.temporal_address,
            "ONCEFLOW_TASK_QUEUE": self.task_queue,
            "PYTHONUNBUFFERED": "1",
            **extra,
        }

    async def task_workflows(self, tenant: str) -> int:
        """How many task workflows a tenant ran (visibility settles first).

        Workflow ids are derived from tenant, scope and key, and the dev server outlives
        each test's tables, so every test works in a tenant of its own.
        """
        query = f"WorkflowType = 'AgentTaskWorkflow' AND OnceflowTenant = '{tenant}'"
        return await settled_count(self.client, query)


@dataclass
class GatewayProcess:
    """One ``onceflow gateway`` process and its log."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        """Everything the process wrote so far."""
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in a crash."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=HANG_SECONDS)

    def stop(self) -> None:
        """SIGTERM and wait for a clean exit."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=HANG_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_gateway(
    stack: Stack, log_path: Path, *, module: str = "onceflow.cli", **settings: str
) -> GatewayProcess:
    """Start ``onceflow gateway --port 0`` (or ``module``'s gateway) and wait until it listens."""
    log_file = log_path.open("wb")
    command = ["gateway"] if module == "onceflow.cli" else []
    process = subprocess.Popen(
        [sys.executable, "-m", module, *command, "--port", "0"],
        cwd=repo_root(),
        env={**os.environ, **stack.env(**settings)},
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    log_file.close()
    try:
        line = log_line_blocking(process, log_path, READY)
    except BaseException:
        process.kill()
        raise
    url = line.split(READY, 1)[1].split()[0]
    return GatewayProcess(url=url, process=process, log_path=log_path)


@pytest.fixture(scope="module")
async def stack(postgres_url: str, dev_server: WorkflowEnvironment) -> AsyncIterator[Stack]:
    """A task queue with an in-process worker (every workflow and activity) for the module."""
    async with serving_stack(postgres_url, dev_server, tools=builtin()) as served:
        yield served


@asynccontextmanager
async def serving_stack(
    postgres_url: str, dev_server: WorkflowEnvironment, *, tools: tuple[Tool, ...]
) -> AsyncIterator[Stack]:
    """A fresh task queue served by an in-process worker running ``tools``."""
    task_queue = f"gw-{uuid.uuid4().hex[:10]}"
    settings = OnceflowSettings(task_queue=task_queue, shutdown_grace_seconds=2)
    async with build_pool(postgres_url, max_size=10) as pool:
        async with build_worker(dev_server.client, pool, settings, tools=tools):
            # The first task of a worker pays for loading the workflow sandbox; pay it here
            # rather than inside a test's bounded wait.
            await TaskClient(dev_server.client, task_queue=task_queue).start(
                AgentTaskInput(
                    tenant="warm-up",
                    principal="warm-up",
                    steps=[
                        StepInput(
                            step_id="1",
                            tool="issue_coupon",
                            arguments={"user_id": task_queue, "coupon_id": "WARM-UP"},
                        )
                    ],
                ),
                workflow_id=f"warm-up-{task_queue}",
            )
            await dev_server.client.get_workflow_handle(f"warm-up-{task_queue}").result()
            yield Stack(
                postgres_url=postgres_url,
                temporal_address=dev_server.client.service_client.config.target_host,
                task_queue=task_queue,
                client=dev_server.client,
            )


@dataclass(frozen=True)
class StripeProvider:
    """The local Stripe-compatible provider of a module, and its control client."""

    base_url: str
    control: ProviderControl

    async def charges(self, order_id: str) -> list[Any]:
        """The PaymentIntents that took money for ``order_id``, from the ledger."""
        return [
            entry
            for entry in await self.control.ledger()
            if entry.kind == "charge" and entry.metadata.get("order_id") == order_id
        ]


@pytest.fixture(scope="module")
async def stripe_provider() -> AsyncIterator[StripeProvider]:
    """A local Stripe-compatible provider for the module (served in the tests' loop)."""
    async with (
        running_provider(ProviderConfig()) as running,
        ProviderControl(running.base_url) as control,
    ):
        yield StripeProvider(base_url=running.base_url, control=control)


def stripe_tools(base_url: str) -> tuple[Tool, ...]:
    """The built-in tools with the payment tools talking to the provider at ``base_url``."""
    return builtin(
        stripe=StripeSettings(
            api_key="sk_test_onceflow_gateway",
            api_base=base_url,
            account="acct_onceflow_gateway",
        )
    )


@pytest.fixture(scope="module")
def gateways(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    """Two gateway processes on the same stack, as behind a load balancer."""
    logs = tmp_path_factory.mktemp("gateway-logs")
    first = start_gateway(stack, logs / "a.log")
    try:
        second = start_gateway(stack, logs / "b.log")
    except BaseException:
        first.stop()
        raise
    yield first, second
    first.stop()
    second.stop()


@pytest.fixture
async def database(postgres_url: str) -> str:
    """The database URL with the business tables emptied, without blocking the event loop.

    Overrides the shared fixture for this package: the module's worker runs in this event
    loop, and a task still running from the previous test must be able to finish its
    transaction, or a blocking TRUNCATE would wait for it forever.
    """
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        await conn.execute("SET lock_timeout = '20s'")
        await conn.execute(f"TRUNCATE {', '.join(BUSINESS_TABLES)} CASCADE")
    return postgres_url


@dataclass(frozen=True)
class Caller:
    """A principal and its API key."""

    principal: Principal
    api_key: str

    @property
    def headers(self) -> dict[str, str]:
        """The ``Authorization`` header."""
        return {"Authorization": f"Bearer {self.api_key}"}


def new_tenant() -> str:
    """A tenant no other test uses (task workflow ids include the tenant)."""
    return f"t-{uuid.uuid4().hex[:10]}"


async def make_caller(
    database_url: str,
    *,
    tenant: str,
    name: str = "agent-1",
    tools: tuple[str, ...] = ("issue_coupon", "create_order"),
    may_decide: bool = False,
    may_approve: bool = False,
    key_quota: int | None = None,
) -> Caller:
    """Create a principal straight in the database (as ``onceflow principal add`` does)."""
    async with build_pool(database_url, max_size=1) as pool:
        principal, api_key = await PrincipalStore(pool).create(
            tenant=tenant,
            name=name,
            tools=tools,
            may_decide=may_decide,
            may_approve=may_approve,
            key_quota=key_quota,
        )
    return Caller(principal, api_key)


@pytest.fixture
async def agent(database: str) -> Caller:
    """An agent of a fresh tenant, allowed both reference tools, on empty tables."""
    return await make_caller(database, tenant=new_tenant())


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client that never retries by itself."""
    async with httpx.AsyncClient(timeout=60) as client:
        yield client


def rows(database_url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows of a query, read in a fresh connection."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def execute(database_url: str, sql: str, *params: Any) -> int:
    """Run one statement; returns the rows it changed."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute(sql, params).rowcount


def count(database_url: str, table: str) -> int:
    """Rows in a table."""
    return int(rows(database_url, f"SELECT count(*) FROM {table}")[0][0])


def open_service(
    stack: Stack,
    *,
    after_claim: Callable[[], Awaitable[None]] | None = None,
    **settings: Any,
) -> AbstractAsyncContextManager[BoundaryService]:
    """An in-process boundary service on the stack with the given gateway settings."""
    return open_boundary(
        OnceflowSettings(task_queue=stack.task_queue),
        GatewaySettings(**settings),
        database_url=stack.postgres_url,
        temporal_address=stack.temporal_address,
        after_claim=after_claim,
    )


class HoldAfterClaim:
    """Holds a boundary inside the claim→start window, as if its process hung there.

    Pass ``hold`` as ``open_service(after_claim=...)``; ``claimed`` is set once a claim
    is held, so a test waits on it instead of polling the records table.
    """

    def __init__(self) -> None:
        self.claimed = asyncio.Event()

    async def hold(self) -> None:
        self.claimed.set()
        await asyncio.Event().wait()
