"""A provider that fails for a while, through the whole stack: real Temporal, PostgreSQL,
the Stripe SDK over HTTP and the local Stripe-compatible provider, judged in its request
log and ledger.

While the provider fails, the fleet sends it each task's first attempt, its retry bucket
and one probe per interval, nothing more; the held steps wait off their tasks' clocks,
and once it answers again every task charges, once. A 429 holds every send and spends no
attempt; a paused provider receives nothing until an operator resumes it.
"""

import asyncio
import os
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta

import pytest
from onceflow_devstack.stripe_provider import Fault, ProviderControl
from onceflow_devstack.stripe_provider._ledger import RequestRecord
from psycopg_pool import AsyncConnectionPool
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.payments import PaymentToolSettings, StripePaymentProvider, charge_payment_contract
from onceflow.retry_policy import RetryBudget
from onceflow.settings import OnceflowSettings
from onceflow.task_api import TaskClient
from onceflow.tools.providers import Provider, provider_states
from onceflow.worker import build_worker
from onceflow.workflows.task_models import StepState, TaskState, TaskStatus
from tests.harness import HANG_SECONDS, eventually, onceflow_command, wait_for
from tests.payments.conftest import CHARGE_PAYMENT, PAYMENT_TOOLS, one_order, start_task

FLAKY = Provider(name="flaky-stripe", retry_tokens=2, probe_every=timedelta(seconds=2))
"""A provider whose bucket is two retries and which is probed every two seconds."""
BUDGETED_CHARGE = replace(
    CHARGE_PAYMENT,
    contract=replace(
        charge_payment_contract(PaymentToolSettings(), name="charge_payment_flaky"),
        provider=FLAKY,
    ),
)
IMPATIENT_CHARGE = replace(
    CHARGE_PAYMENT,
    contract=replace(
        charge_payment_contract(PaymentToolSettings(), name="charge_payment_impatient"),
        provider=FLAKY,
        provider_wait_limit=timedelta(seconds=3),
    ),
)
"""Waits at most three seconds, in all, for its provider."""
BUDGET = RetryBudget(
    max_attempts_per_task=8,
    max_attempts_per_step=5,
    initial_backoff=timedelta(milliseconds=50),
    max_backoff=timedelta(milliseconds=200),
    deadline=timedelta(minutes=2),
)
TASKS = 6


@pytest.fixture
async def budget_worker(
    dev_server: WorkflowEnvironment,
    pool: AsyncConnectionPool,
    payment_provider: StripePaymentProvider,
    task_queue: str,
) -> AsyncIterator[Worker]:
    tools = (*PAYMENT_TOOLS, BUDGETED_CHARGE, IMPATIENT_CHARGE)
    async with build_worker(
        dev_server.client,
        pool,
        OnceflowSettings(task_queue=task_queue, shutdown_grace_seconds=1),
        tools=tools,
        clients={tool.name: payment_provider for tool in tools},
    ) as running:
        yield running


def posts(log: list[RequestRecord]) -> list[RequestRecord]:
    return [r for r in log if r.method == "POST" and r.path == "/v1/payment_intents"]


def waiting_for_provider(status: TaskStatus) -> bool:
    return all(step.waiting_for_provider for step in status.steps)


async def all_waiting(tasks: TaskClient, ids: list[str]) -> None:
    await asyncio.gather(*(wait_for(tasks, task, waiting_for_provider) for task in ids))


async def start_charges(tasks: TaskClient, tool: str, count: int) -> list[str]:
    ids = []
    for _ in range(count):
        order = one_order(uuid.uuid4().hex[:12])
        ids.append(await start_task(tasks, ("pay", tool, order), budget=BUDGET))
    return ids


async def test_a_brownout_gets_first_attempts_the_bucket_and_probes_then_every_task_charges_once(
    budget_worker: Worker, tasks: TaskClient, control: ProviderControl, pool: AsyncConnectionPool
) -> None:
    # Nothing charged by the failing requests: Stripe releases the key, a repeat runs afresh.
    await control.add_fault(
        Fault.ERROR_500_BEFORE_EXECUTING, path_prefix="/v1/payment_intents", times=None
    )
    ids = await start_charges(tasks, "charge_payment_flaky", TASKS)
    await all_waiting(tasks, ids)
    held_at = time.monotonic()
    sent_when_all_held = len(posts(await control.requests()))
    # Each task's first attempt, then the bucket; at most a probe per interval since.
    assert TASKS <= sent_when_all_held <= TASKS + FLAKY.retry_tokens + 1
    [state] = await provider_states(pool)
    assert state.health(FLAKY).value == "shedding_retries"
    status = await tasks.status(ids[0])
    assert "waiting for flaky-stripe to recover" in (status.steps[0].waiting_for_provider or "")
    assert status.steps[0].state is StepState.BACKING_OFF

    # Two probes go out (a signal, not a sleep), and no more than the interval allows.
    await eventually(
        control.requests,
        until=lambda log: len(posts(log)) >= sent_when_all_held + 2,
        what="two probes reach the failing provider",
    )
    probes = len(posts(await control.requests())) - sent_when_all_held
    elapsed = time.monotonic() - held_at
    assert probes <= elapsed / FLAKY.probe_every.total_seconds() + 1

    await control.clear_faults()
    results = await asyncio.gather(*(tasks.result(task) for task in ids))
    assert [r.state for r in results] == [TaskState.SUCCEEDED] * TASKS
    # No person was needed, and no held wait spent an attempt or the deadline.
    for result in results:
        [step] = result.steps
        assert result.decisions == []
        assert step.provider_waited > timedelta(0)
        assert step.waiting_for_provider is None
        assert not any(attempt.held_by_provider for attempt in step.attempts)
        assert len(step.attempts) <= BUDGET.max_attempts_per_step
    ledger = await control.ledger()
    assert sorted(e.kind for e in ledger) == ["charge"] * TASKS
    log = posts(await control.requests())
    assert len({r.idempotency_key for r in log}) == TASKS  # one derived key per task
    [state] = await provider_states(pool)
    assert state.health(FLAKY).value == "healthy"


async def test_429s_hold_every_send_and_spend_no_attempt(
    budget_worker: Worker, tasks: TaskClient, control: ProviderControl
) -> None:
    await control.add_fault(Fault.RATE_LIMIT_429, path_prefix="/v1/payment_intents", times=None)
    ids = await start_charges(tasks, "charge_payment_flaky", 3)
    await all_waiting(tasks, ids)
    await control.clear_faults()
    results = await asyncio.gather(*(tasks.result(task) for task in ids))
    assert [r.state for r in results] == [TaskState.SUCCEEDED] * 3
    # The 429s are recorded as the provider's "not now" (a task that started while the
    # provider's hold was on sent nothing until it passed, so it met none of its own).
    attempts = [attempt for result in results for attempt in result.steps[0].attempts]
    assert any(attempt.throttled for attempt in attempts)
    log = posts(await control.requests())
    assert sum(attempt.throttled for attempt in attempts) == sum(r.status == 429 for r in log)
    for result in results:
        # A 429 spent nothing of the task's attempts (a plan counts every other one).
        [step] = result.steps
        assert result.budget.attempts_used == len([a for a in step.attempts if not a.free])
    assert len(await control.ledger()) == 3


async def test_a_step_whose_provider_wait_limit_passes_fails_naming_the_provider(
    budget_worker: Worker, tasks: TaskClient, control: ProviderControl
) -> None:
    await control.add_fault(Fault.RATE_LIMIT_429, path_prefix="/v1/payment_intents", times=None)
    [task] = await start_charges(tasks, "charge_payment_impatient", 1)
    result = await tasks.result(task)
    assert result.state is TaskState.FAILED
    reason = result.failure_reason or ""
    assert "its provider did not let it send within 0:00:03" in reason
    assert "flaky-stripe" in reason and "429" in reason
    [step] = result.steps
    assert timedelta(seconds=3) <= step.provider_waited
    assert step.attempts[-1].held_by_provider  # the last, held, attempt sent nothing
    assert await control.ledger() == []


def provider_cli(database: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        onceflow_command("provider", *arguments),
        env={**os.environ, "DATABASE_URL": database, "USER": "oncall"},
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
        check=False,
    )


async def test_a_paused_provider_receives_nothing_until_an_operator_resumes_it(
    budget_worker: Worker, tasks: TaskClient, control: ProviderControl, database: str
) -> None:
    paused = await asyncio.to_thread(
        provider_cli, database, "pause", "stripe", "--reason", "Stripe incident INC-7"
    )
    assert paused.returncode == 0, paused.stderr
    assert "paused stripe" in paused.stdout
    [task] = await start_charges(tasks, "charge_payment", 1)
    status = await wait_for(tasks, task, waiting_for_provider)
    reason = status.steps[0].waiting_for_provider or ""
    assert "stripe is paused by oncall" in reason and "INC-7" in reason
    assert posts(await control.requests()) == []  # nothing sent, not even a first attempt

    shown = await asyncio.to_thread(provider_cli, database, "status", "--json")
    assert shown.returncode == 0, shown.stderr
    assert '"state": "paused"' in shown.stdout and "INC-7" in shown.stdout
    unknown = await asyncio.to_thread(provider_cli, database, "pause", "strype", "--reason", "x")
    assert unknown.returncode == 2 and "stripe" in unknown.stderr

    resumed = await asyncio.to_thread(provider_cli, database, "resume", "stripe", "--reason", "ok")
    assert resumed.returncode == 0, resumed.stderr
    result = await tasks.result(task)
    assert result.state is TaskState.SUCCEEDED
    assert len(posts(await control.requests())) == 1
    assert result.steps[0].provider_waited > timedelta(0)
    # The wait was off the clock: the deadline moved by it.
    assert result.budget.waited_for_people >= result.steps[0].provider_waited
