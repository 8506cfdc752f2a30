"""A relay cut off from PostgreSQL keeps running and delivers, once, when it is back.

The relay's pool reaches the database through a proxy that is stopped (every connection
cut, new ones refused) until the pool has given up a round of reconnection attempts, with
an email armed meanwhile by the worker (which still reaches the database).
"""

import asyncio

import psycopg
from onceflow_devstack.smtp_sink import RunningSink
from psycopg.conninfo import make_conninfo
from temporalio.worker import Worker

from onceflow.email import EmailSettings, OutboxRelay
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient
from onceflow.workflows.task_models import TaskState
from tests.gateway.outages import database_proxy
from tests.harness import HANG_SECONDS, eventually

from .conftest import deliveries, outbox_row, start_email, welcome_email


def pending_emails(database: str) -> int:
    with psycopg.connect(database) as conn:
        row = conn.execute("SELECT count(*) FROM email_outbox WHERE state = 'pending'").fetchone()
    return int(row[0]) if row else 0


async def test_a_relay_cut_off_from_its_database_delivers_once_it_is_back(
    sink: RunningSink, worker: Worker, tasks: TaskClient, database: str, settings: EmailSettings
) -> None:
    proxy = database_proxy(database)
    await proxy.start()
    through_proxy = make_conninfo(database, host="127.0.0.1", port=proxy.port)
    async with build_pool(through_proxy) as pool:
        relay = OutboxRelay(pool, settings)
        stop = asyncio.Event()
        running = asyncio.create_task(relay.run(stop))
        try:
            await proxy.stop()
            await eventually(lambda: pool.unreachable, what="the relay's pool gave up a round")
            workflow_id = await start_email(tasks, welcome_email())
            await eventually(lambda: pending_emails(database), what="the worker armed the email")
            assert not running.done()  # the relay rides the outage out

            await proxy.start(proxy.port)
            result = await asyncio.wait_for(tasks.result(workflow_id), timeout=HANG_SECONDS)
        finally:
            stop.set()
            await asyncio.wait_for(running, timeout=HANG_SECONDS)
            await proxy.stop()

    step = result.step("mail")
    message_id = step.resource_id or ""
    assert result.state is TaskState.SUCCEEDED
    assert [outcome for _, _, outcome in deliveries(database, message_id)] == ["delivered"]
    assert outbox_row(database, message_id)[0] == "delivered"
    assert sink.sink.deliveries(message_id) == 1 and sink.sink.applications(message_id) == 1
