"""The email and deployment part of ``make demo`` against a worker, a relay, the local
SMTP sink and the local deployment target."""

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator

import pytest
from onceflow_devstack.demo_email_deploy import email_and_deploy_scenario
from onceflow_devstack.deploy_target import RunningTarget
from onceflow_devstack.smtp_sink import RunningSink, running_smtp_sink
from psycopg_pool import AsyncConnectionPool
from rich.console import Console
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.email import EmailSettings, OutboxRelay
from onceflow.task_api import TaskClient
from tests.harness import HANG_SECONDS

from .conftest import deployment_rows


@pytest.fixture
async def sink_with_relay(pool: AsyncConnectionPool) -> AsyncIterator[RunningSink]:
    async with running_smtp_sink(control_port=0) as sink:
        relay = OutboxRelay(pool, EmailSettings(smtp_url=sink.smtp_url, poll_interval="PT0.1S"))
        stop = asyncio.Event()
        task = asyncio.create_task(relay.run(stop))
        yield sink
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=HANG_SECONDS)


async def test_the_demo_delivers_an_email_and_an_approved_deployment(
    dev_server: WorkflowEnvironment,
    sink_with_relay: RunningSink,
    target: RunningTarget,
    worker: Worker,
    tasks: TaskClient,
    database: str,
) -> None:
    output = io.StringIO()
    await email_and_deploy_scenario(
        Console(file=output, width=200, color_system=None),
        tasks,
        database_url=database,
        deploy_target_url=target.url,
        smtp_sink_control_url=sink_with_relay.control_url,
        ui_url="http://localhost:8233",
    )

    text = output.getvalue()
    [received] = sink_with_relay.sink.received
    assert received.applied and received.rcpt_tos == ["ada@example.com"]
    assert f"Message-ID {received.message_id}" in text
    assert "the SMTP sink received: To ada@example.com" in text
    assert "awaiting_approval" in text and "Nothing was deployed" in text
    assert "Approved through the task's approve Update" in text
    [(_, state, token, steps, _)] = deployment_rows(database)
    assert (state, token, steps) == ("succeeded", 1, 4)
    assert text.count("applied") >= 4 and "target: activate  token 1  applied" in text
