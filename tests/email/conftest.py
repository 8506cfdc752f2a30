"""Email on real servers: the local SMTP sink over TCP, real relays, the Temporal dev
server and PostgreSQL. Nothing is mocked; assertions read what the sink received."""

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from onceflow_devstack.smtp_sink import RunningSink, running_smtp_sink
from psycopg_pool import AsyncConnectionPool
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.email import EmailSettings, EmailToolSettings, OutboxRelay, email_tools
from onceflow.retry_policy import RetryBudget
from onceflow.settings import OnceflowSettings
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient
from onceflow.tools.worker import derive_task_workflow_id
from onceflow.worker import build_worker
from onceflow.workflows.task_models import AgentTaskInput, StepInput, TaskState
from tests.harness import HANG_SECONDS, parked, passed_marker, wait_for  # noqa: F401 - re-exported

TENANT = "acme"
FAST_BUDGET = RetryBudget(
    max_attempts_per_task=6,
    max_attempts_per_step=3,
    initial_backoff=timedelta(milliseconds=50),
    max_backoff=timedelta(milliseconds=200),
    deadline=timedelta(minutes=2),
)


def email_settings(smtp_url: str, **overrides: Any) -> EmailSettings:
    """Relay and activity settings pointed at the test's sink, with short timings."""
    values: dict[str, Any] = {
        "smtp_url": smtp_url,
        "smtp_timeout": timedelta(seconds=1),
        "claim_lease": timedelta(seconds=1.5),
        "poll_interval": timedelta(milliseconds=100),
        "relay_id": f"relay-test-{uuid.uuid4().hex[:6]}",
        **overrides,
    }
    return EmailSettings(**values)


def welcome_email(n: int = 0) -> dict[str, Any]:
    return {
        "to": [f"customer-{n}@example.com"],
        "subject": f"Welcome aboard #{n}",
        "body": "Hello!\n.\nA line with a lone dot above, to exercise dot-stuffing.",
    }


@pytest.fixture
async def sink() -> AsyncIterator[RunningSink]:
    """A fresh SMTP sink on an ephemeral port of 127.0.0.1."""
    async with running_smtp_sink() as running:
        yield running


@pytest.fixture
async def pool(database: str) -> AsyncIterator[AsyncConnectionPool]:
    async with build_pool(database) as opened:
        yield opened


@pytest.fixture
def settings(sink: RunningSink) -> EmailSettings:
    return email_settings(sink.smtp_url)


@pytest.fixture
async def relay(pool: AsyncConnectionPool, settings: EmailSettings) -> AsyncIterator[OutboxRelay]:
    """One relay running in the test's event loop."""
    running = OutboxRelay(pool, settings)
    stop = asyncio.Event()
    task = asyncio.create_task(running.run(stop))
    yield running
    stop.set()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(task, timeout=HANG_SECONDS)


@pytest.fixture
async def worker(
    dev_server: WorkflowEnvironment,
    pool: AsyncConnectionPool,
    settings: EmailSettings,
    task_queue: str,
) -> AsyncIterator[Worker]:
    """A worker built by onceflow's composition point, serving ``send_email`` with the
    test's email settings."""
    async with build_worker(
        dev_server.client,
        pool,
        OnceflowSettings(task_queue=task_queue, shutdown_grace_seconds=1),
        tools=email_tools(EmailToolSettings(), settings),
    ) as running:
        yield running


@pytest.fixture
def tasks(dev_server: WorkflowEnvironment, task_queue: str) -> TaskClient:
    return TaskClient(dev_server.client, task_queue=task_queue)


async def start_email(tasks: TaskClient, arguments: dict[str, Any]) -> str:
    """Start a one-step ``send_email`` task (step ``mail``); returns its workflow id."""
    task = AgentTaskInput(
        tenant=TENANT,
        principal="support-agent",
        steps=[StepInput(step_id="mail", tool="send_email", arguments=arguments)],
        budget=FAST_BUDGET,
    )
    workflow_id = derive_task_workflow_id(
        tenant=TENANT, scope="task", idempotency_key=f"mail-{uuid.uuid4().hex}"
    )
    await tasks.start(task, workflow_id=workflow_id)
    return workflow_id


async def relay_caught_up(tasks: TaskClient, sink: RunningSink) -> None:
    """Prove the relay went quiet: a marker email, armed now, reached the sink.

    A relay claims armed rows (and rows whose claim expired) in arming order, so once it
    delivered a marker armed after the fact it has polled since, and has claimed and
    delivered everything that was due before the marker.
    """

    async def send() -> str:
        return await start_email(tasks, {**welcome_email(), "subject": "relay marker"})

    async def delivered(workflow_id: str) -> bool:
        status = await tasks.status(workflow_id)
        message_id = status.step("mail").resource_id
        return status.state is TaskState.SUCCEEDED and sink.sink.deliveries(message_id or "") > 0

    await passed_marker(send, delivered, what="the outbox relay")


def deliveries(database: str, message_id: str) -> list[tuple[Any, ...]]:
    """``(relay_id, took_over, outcome)`` of every delivery started for one email."""
    with psycopg.connect(database) as conn:
        return conn.execute(
            "SELECT d.relay_id, d.took_over, d.outcome FROM email_deliveries d"
            " JOIN email_messages m USING (event_id) WHERE m.message_id = %s"
            " ORDER BY d.delivery_id",
            (message_id,),
        ).fetchall()


def outbox_row(database: str, message_id: str) -> tuple[Any, ...]:
    """``(state, arming)`` of one email's outbox row."""
    with psycopg.connect(database) as conn:
        row = conn.execute(
            "SELECT o.state, o.arming FROM email_outbox o JOIN email_messages m USING (event_id)"
            " WHERE m.message_id = %s",
            (message_id,),
        ).fetchone()
    assert row is not None
    return row
