"""A caller workflow charges through onceflow's Nexus service: once, through its worker
killed mid-call and its replay, through a park an operator reconciles, and with the
model's repeat of one intent answered by its first call. Judged by the provider's ledger."""

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from onceflow_devstack.stripe_provider import Fault, ProviderControl
from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.gateway import TOOL_CALL_STEP_ID
from onceflow.nexus import WITHDRAWN_BY_CALLER, NexusPlan, NexusPrincipal, ensure_nexus_endpoint
from onceflow.payments import StripePaymentProvider
from onceflow.task_api import TaskClient
from onceflow.workflows.task_models import (
    StepInput,
    StepState,
    TaskState,
    TaskStatus,
)
from tests.harness import eventually, spawn, stop, wait_for_line
from tests.payments.conftest import SHORT_RETENTION_CHARGE, TENANT, charge_intents, order

from .caller_worker import CALLER_READY
from .callers import (
    AgentInput,
    AgentOutcome,
    CancellingAgent,
    ChargingAgent,
    PlanInput,
    PlannedCall,
    PlanningAgent,
)
from .onceflow_side import (
    make_charges_unknowable,
    nexus_task_id,
    reconcile_as_happened,
    replay_caller_histories,
    serving_nexus,
    until_parked,
)

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]

AGENT = NexusPrincipal(tenant=TENANT, name="nexus-agent")
"""The principal the test worker's Nexus service acts as."""


@pytest.fixture
async def onceflow_worker(
    dev_server: WorkflowEnvironment,
    pool: AsyncConnectionPool,
    payment_provider: StripePaymentProvider,
    task_queue: str,
) -> AsyncIterator[Worker]:
    """onceflow's worker serving the Nexus service as ``acme/nexus-agent``, who may
    charge and refund (not the test-only charge)."""
    tools = ["charge_payment", "refund_payment"]
    async with serving_nexus(
        dev_server.client, pool, payment_provider, task_queue, AGENT, tools
    ) as running:
        yield running


@dataclass
class CallerApplication:
    """The test's caller application: its worker on its own queue (``async with
    caller.worker(): ...``), its agents calling onceflow through an endpoint of the test's
    own, and onceflow's ``tasks`` those calls run as."""

    client: Client
    queue: str
    endpoint: str
    tasks: TaskClient

    @asynccontextmanager
    async def worker(self, **options: Any) -> AsyncIterator[Worker]:
        async with Worker(
            self.client, task_queue=self.queue, workflows=CALLER_WORKFLOWS, **options
        ) as worker:
            yield worker

    async def start_agent(
        self, *calls: PlannedCall, workflow_id: str | None = None
    ) -> WorkflowHandle[Any, AgentOutcome]:
        return await self.client.start_workflow(
            ChargingAgent.run,
            AgentInput(endpoint=self.endpoint, calls=list(calls)),
            id=workflow_id or f"agent-{uuid.uuid4().hex[:12]}",
            task_queue=self.queue,
        )

    def task_of(self, caller_id: str, call_id: str, tool: str) -> str:
        """The onceflow task a caller's call runs as."""
        return nexus_task_id(AGENT, self.client.namespace, caller_id, call_id, tool)


CALLER_WORKFLOWS = [ChargingAgent, CancellingAgent, PlanningAgent]


@pytest.fixture
async def caller(
    dev_server: WorkflowEnvironment, onceflow_worker: Worker, task_queue: str
) -> AsyncIterator[CallerApplication]:
    """The caller application, calling the test's onceflow worker through an endpoint of
    its own (created as ``onceflow dev`` creates its own). Every caller history the test
    made is replayed at its end by a plain ``Replayer`` (onceflow's tasks are, by the
    session's)."""
    endpoint = f"onceflow-tools-{uuid.uuid4().hex[:8]}"
    await ensure_nexus_endpoint(dev_server.client, name=endpoint, task_queue=task_queue)
    queue = f"caller-{uuid.uuid4().hex[:12]}"
    tasks = TaskClient(dev_server.client, task_queue=task_queue)
    yield CallerApplication(dev_server.client, queue, endpoint, tasks)
    assert await replay_caller_histories(
        dev_server.client, f"TaskQueue = '{queue}'", CALLER_WORKFLOWS, "caller-application"
    )


def charged(status: TaskStatus) -> str | None:
    step = status.step(TOOL_CALL_STEP_ID)
    return step.resource_id if step.state is StepState.SUCCEEDED else None


async def test_a_caller_charges_once_and_its_repeat_of_the_intent_is_answered_by_the_first(
    caller: CallerApplication, control: ProviderControl
) -> None:
    arguments = order("nexus")
    calls = (
        PlannedCall(call_id="call-1", tool="charge_payment", arguments=arguments),
        # The model picks the same charge again, under a call id of its own.
        PlannedCall(call_id="call-2", tool="charge_payment", arguments=arguments),
        # Refused by the principal's tools: nothing starts.
        PlannedCall(call_id="call-3", tool=SHORT_RETENTION_CHARGE.name, arguments=arguments),
    )
    async with caller.worker():
        handle = await caller.start_agent(*calls)
        outcome = await handle.result()

    [intent] = await charge_intents(control)
    first, repeat = outcome.statuses
    assert first.state is TaskState.SUCCEEDED and charged(first) == intent
    assert first.workflow_id == caller.task_of(handle.id, "call-1", "charge_payment")
    assert first.principal == AGENT.name and first.tenant == TENANT
    assert repeat.workflow_id != first.workflow_id and charged(repeat) == intent
    assert repeat.step(TOOL_CALL_STEP_ID).result["repeat_of"] == {
        "task_id": first.workflow_id,
        "step_id": TOOL_CALL_STEP_ID,
    }
    [refusal] = outcome.refusals
    assert f"principal '{AGENT.name}' may not call '{SHORT_RETENTION_CHARGE.name}'" in refusal

    # The caller run again under its workflow id (a retry, a reset): the same calls are
    # the same tasks, which answer with their ends; nothing is sent again.
    posts = len([r for r in await control.requests() if r.method == "POST"])
    async with caller.worker():
        again = await caller.start_agent(*calls[:2], workflow_id=handle.id)
        rerun = await again.result()
    assert [status.workflow_id for status in rerun.statuses] == [
        first.workflow_id,
        repeat.workflow_id,
    ]
    assert [charged(status) for status in rerun.statuses] == [intent, intent]
    assert len([r for r in await control.requests() if r.method == "POST"]) == posts
    assert await charge_intents(control) == [intent]


async def test_a_caller_whose_worker_is_killed_mid_call_charges_once(
    caller: CallerApplication, control: ProviderControl
) -> None:
    # The charge commits, then its answer takes 3 s: the attempt times out (unknown) and
    # the step repeats it under the same key, while the caller's worker is dead.
    await control.add_fault(
        Fault.DELAY_AFTER_COMMIT, path_prefix="/v1/payment_intents", delay_seconds=3
    )
    process = spawn(
        [sys.executable, "-m", "tests.nexus.caller_worker", caller.queue],
        env={"TEMPORAL_ADDRESS": caller.client.service_client.config.target_host},
    )
    try:
        await asyncio.to_thread(wait_for_line, process, CALLER_READY)
        call = PlannedCall(call_id="call-1", tool="charge_payment", arguments=order("kill"))
        handle = await caller.start_agent(call)
        await eventually(lambda: charge_intents(control), what="the charge commits at the provider")
        process.kill()  # SIGKILL, mid-call: the operation is open, its answer not sent
    finally:
        stop(process)
    task_id = caller.task_of(handle.id, "call-1", "charge_payment")
    ended = await caller.tasks.result(task_id)
    assert (await handle.describe()).status is WorkflowExecutionStatus.RUNNING

    # Another worker, caching nothing: it replays the caller from its first event.
    async with caller.worker(max_cached_workflows=0):
        outcome = await handle.result()

    [intent] = await charge_intents(control)
    [status] = outcome.statuses
    assert charged(status) == charged(ended) == intent
    assert len(status.step(TOOL_CALL_STEP_ID).attempts) >= 2  # the timed-out one, repeated


async def test_a_parked_call_keeps_the_caller_waiting_until_it_is_reconciled(
    caller: CallerApplication, control: ProviderControl
) -> None:
    await make_charges_unknowable(control)
    call = PlannedCall(call_id="call-1", tool="charge_payment", arguments=order("parked"))
    tasks = caller.tasks
    async with caller.worker():
        handle = await caller.start_agent(call)
        task_id = caller.task_of(handle.id, "call-1", "charge_payment")
        await until_parked(tasks, task_id, what="the call parks")
        await control.clear_faults()
        # The caller waits on the open operation: running, its call not answered.
        assert (await handle.describe()).status is WorkflowExecutionStatus.RUNNING
        [intent] = await charge_intents(control)

        await reconcile_as_happened(tasks, task_id, intent)
        outcome = await handle.result()

    [status] = outcome.statuses
    assert status.workflow_id == task_id and status.state is TaskState.SUCCEEDED
    assert charged(status) == intent
    assert await charge_intents(control) == [intent]


async def test_a_call_id_reused_for_other_arguments_is_refused_and_starts_nothing(
    caller: CallerApplication, control: ProviderControl
) -> None:
    first = PlannedCall(call_id="call-1", tool="charge_payment", arguments=order("first"))
    other = first.model_copy(update={"arguments": order("other")})
    async with caller.worker():
        handle = await caller.start_agent(first)
        [status] = (await handle.result()).statuses
        # A new run of the caller (a reset) sends other arguments under the same call id.
        again = await caller.start_agent(other, workflow_id=handle.id)
        outcome = await again.result()

    assert outcome.statuses == []
    [refusal] = outcome.refusals
    assert "this call id was used for another request" in refusal
    assert await charge_intents(control) == [charged(status)]


async def test_a_cancelled_call_awaiting_approval_is_withdrawn_and_never_sent(
    caller: CallerApplication, control: ProviderControl
) -> None:
    # A full refund always waits for a person's approval before anything is sent.
    call = PlannedCall(
        call_id="refund-1", tool="refund_payment", arguments={"payment_intent": "pi_12345"}
    )
    tasks = caller.tasks
    async with caller.worker():
        handle = await caller.client.start_workflow(
            CancellingAgent.run,
            AgentInput(endpoint=caller.endpoint, calls=[call]),
            id=f"agent-{uuid.uuid4().hex[:12]}",
            task_queue=caller.queue,
        )
        task_id = caller.task_of(handle.id, "refund-1", "refund_payment")
        await eventually(
            lambda: tasks.summary(task_id),
            until=lambda summary: summary is not None and summary.state == "awaiting_approval",
            what="the refund awaits approval",
        )
        await handle.signal(CancellingAgent.give_up)
        await handle.result()

    ended = await tasks.result(task_id)
    step = ended.step(TOOL_CALL_STEP_ID)
    assert step.state is StepState.DENIED and step.attempts == []
    [decision] = ended.decisions
    assert decision.accepted and decision.reason == WITHDRAWN_BY_CALLER
    assert decision.operator == AGENT.name
    assert [r for r in await control.requests() if r.method == "POST"] == []


async def test_a_plan_runs_as_one_task_and_charges_and_refunds_once(
    caller: CallerApplication, control: ProviderControl
) -> None:
    plan = NexusPlan(
        call_id="plan-1",
        steps=[
            StepInput(step_id="pay", tool="charge_payment", arguments=order("plan")),
            StepInput(
                step_id="refund",
                tool="refund_payment",
                arguments={"charge_step": "pay", "amount": 1500, "reason": "requested_by_customer"},
            ),
        ],
    )
    async with caller.worker():
        status = await caller.client.execute_workflow(
            PlanningAgent.run,
            PlanInput(endpoint=caller.endpoint, plan=plan),
            id=f"agent-{uuid.uuid4().hex[:12]}",
            task_queue=caller.queue,
        )

    assert status.state is TaskState.SUCCEEDED, status.failure_reason
    ledger = await control.ledger()
    assert sorted(entry.kind for entry in ledger) == ["charge", "refund"]
    assert status.step("pay").resource_id == next(e.object_id for e in ledger if e.kind == "charge")
