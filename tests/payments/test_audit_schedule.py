"""``onceflow audit --schedule``: a Temporal Schedule runs the payments audit as an
``AuditWorkflow`` on a worker (the real dev server, the local provider, PostgreSQL), and
its findings show as the run's result, its current details in the Temporal UI, and the
``onceflow_audit_findings`` gauge from the workflow's metric meter.
"""

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from onceflow_devstack.stripe_provider import RunningProvider
from psycopg_pool import AsyncConnectionPool
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from onceflow.cli._audit_schedule import audit_schedule_id, ensure_audit_schedule
from onceflow.payments import ChargeRequest, PaymentsAuditor, StripePaymentProvider
from onceflow.plugin import OnceflowPlugin
from onceflow.settings import OnceflowSettings
from onceflow.tools.worker import AuditRunInput, AuditRunResult
from onceflow.worker import build_worker
from onceflow.workflows.audit import AUDIT_FINDINGS_GAUGE, AuditWorkflow
from tests.harness import REPO, eventually

from .conftest import ACCOUNT, API_KEY, PAYMENT_TOOLS, Charge

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]


@pytest.fixture
async def metered_worker(
    dev_server: WorkflowEnvironment,
    pool: AsyncConnectionPool,
    payment_provider: StripePaymentProvider,
    task_queue: str,
) -> AsyncIterator[tuple[Worker, MetricBuffer]]:
    """A worker with the payments auditor whose runtime buffers its metrics."""
    buffer = MetricBuffer(1000)
    client = await Client.connect(
        dev_server.client.service_client.config.target_host,
        runtime=Runtime(telemetry=TelemetryConfig(metrics=buffer)),
        data_converter=dev_server.client.data_converter,
    )
    async with build_worker(
        client,
        pool,
        OnceflowSettings(task_queue=task_queue, shutdown_grace_seconds=1),
        tools=PAYMENT_TOOLS,
        clients={tool.name: payment_provider for tool in PAYMENT_TOOLS},
        auditors={"payments": PaymentsAuditor(payment_provider, pool)},
    ) as worker:
        yield worker, buffer


async def test_a_scheduled_audit_shows_its_findings_as_result_details_and_gauge(
    charge: Charge,
    payment_provider: StripePaymentProvider,
    metered_worker: tuple[Worker, MetricBuffer],
    dev_server: WorkflowEnvironment,
    task_queue: str,
) -> None:
    _, buffer = metered_worker
    await charge("task-scheduled")
    orphan = await payment_provider.create_payment_intent(
        ChargeRequest(
            amount=990,
            currency="usd",
            customer="cus_bob",
            payment_method="pm_card_visa",
            description="by hand",
            metadata={"onceflow_operation": "sha256:0000000000000000"},
        ),
        idempotency_key="by-hand",
    )
    client = dev_server.client
    schedule_id, created = await ensure_audit_schedule(
        client,
        task_queue=task_queue,
        every=timedelta(hours=1),
        request=AuditRunInput(family="payments", window=timedelta(hours=2)),
    )
    assert created and schedule_id == audit_schedule_id("payments", task_queue)
    schedule = client.get_schedule_handle(schedule_id)
    try:
        await schedule.trigger()

        async def started_run() -> str | None:
            actions = (await schedule.describe()).info.recent_actions
            return actions[-1].action.workflow_id if actions else None  # type: ignore[attr-defined]

        run_id = await eventually(started_run, what="the schedule starts its run")
        assert run_id is not None
        run = client.get_workflow_handle(run_id, result_type=AuditRunResult)
        result = await run.result()
        assert result.counts == {"duplicate": 0, "orphan": 1, "missing": 0}
        assert [f["resource_ids"] for f in result.findings] == [[orphan.id]]
        metadata = await run.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        assert metadata.current_details.startswith("**audit of payments: FINDINGS** (0 duplicate")
        assert orphan.id in metadata.current_details

        def gauge() -> dict[str, int]:
            return {
                str(update.attributes["kind"]): int(update.value)
                for update in buffer.retrieve_updates()
                if update.metric.name == AUDIT_FINDINGS_GAUGE
            }

        seen: dict[str, int] = {}

        async def all_kinds() -> bool:
            seen.update(gauge())
            return len(seen) == 3

        await eventually(all_kinds, what="the gauge is set for every kind")
        assert seen == {"duplicate": 0, "orphan": 1, "missing": 0}

        # The run replays in the strict sandbox: its decisions come from its history.
        await Replayer(
            workflows=[], plugins=[OnceflowPlugin(workflows=[AuditWorkflow], strict_sandbox=True)]
        ).replay_workflow(await run.fetch_history())

        # Created again with other settings, it is updated, not doubled.
        again, created = await ensure_audit_schedule(
            client,
            task_queue=task_queue,
            every=timedelta(minutes=30),
            request=AuditRunInput(family="payments", window=timedelta(hours=1)),
        )
        assert (again, created) == (schedule_id, False)
    finally:
        await schedule.delete()


async def test_the_command_creates_then_updates_the_schedule_and_refuses_a_window(
    dev_server: WorkflowEnvironment, provider: RunningProvider, database: str, task_queue: str
) -> None:
    environment = {
        **os.environ,
        "TEMPORAL_ADDRESS": dev_server.client.service_client.config.target_host,
        "ONCEFLOW_TASK_QUEUE": task_queue,
        "DATABASE_URL": database,
        "STRIPE_API_BASE": provider.base_url,
        "STRIPE_API_KEY": API_KEY,
        "ONCEFLOW_STRIPE_ACCOUNT": ACCOUNT,
    }

    async def audit(*arguments: str) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "onceflow.cli",
            "audit",
            *arguments,
            cwd=REPO,
            env=environment,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), timeout=60)
        assert process.returncode is not None
        return process.returncode, out.decode(), err.decode()

    schedule_id = audit_schedule_id("payments", task_queue)
    try:
        code, out, err = await audit("--schedule", "1h", "--since", "2h")
        assert code == 0, err
        assert out.startswith(f"created schedule {schedule_id}: audits payments every 1:00:00")
        code, out, err = await audit("--schedule", "30m", "--since", "1h")
        assert code == 0 and out.startswith(f"updated schedule {schedule_id}"), err
        described = await dev_server.client.get_schedule_handle(schedule_id).describe()
        [interval] = described.schedule.spec.intervals
        assert interval.every == timedelta(minutes=30)
    finally:
        await dev_server.client.get_schedule_handle(schedule_id).delete()
    for refused in (
        ("--schedule", "1h", "--since", "2026-12-01T00:00:00Z"),
        ("--schedule", "1h", "--since", "2h", "--until", "1h"),
        ("--schedule", "2h", "--since", "1h"),
    ):
        code, _, err = await audit(*refused)
        assert code == 2, (refused, err)
