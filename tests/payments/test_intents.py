"""One business intent, one effect: charges of the same order, amount and currency in a
tenant, asked for by different tasks (other keys, other surfaces, other processes), make
one PaymentIntent; PostgreSQL's ``intents`` row decides which call sends. Judged by the
local Stripe-compatible provider's ledger, through the real SDK over HTTP."""

import asyncio
import uuid

import psycopg
from onceflow_devstack.stripe_provider import Fault, ProviderControl
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.retry_policy import OutcomeClass, RetryBudget
from onceflow.task_api import TaskClient
from onceflow.workflows.task_models import (
    AgentTaskInput,
    CallInput,
    OpenTaskOptions,
    StepState,
    TaskState,
)
from tests.harness import eventually

from .conftest import (
    TENANT,
    AdmittingClient,
    WorkerProcess,
    charge_intents,
    order,
    start_task,
)

CONVERGING = RetryBudget(max_attempts_per_task=12, max_attempts_per_step=8)
"""The default backoff with room to wait out a call of the same intent that is sending."""


async def test_the_same_charge_asked_by_another_task_is_answered_by_the_first(
    worker: Worker, tasks: TaskClient, control: ProviderControl
) -> None:
    charge = order("twice")
    first = await tasks.result(await start_task(tasks, ("pay", "charge_payment", charge)))
    second_id = await start_task(tasks, ("pay", "charge_payment", charge))
    second = await tasks.result(second_id)

    [charged] = await charge_intents(control)
    assert first.step("pay").resource_id == charged
    step = second.step("pay")
    assert second.state is TaskState.SUCCEEDED and step.resource_id == charged
    assert step.result["repeat_of"] == {"task_id": first.workflow_id, "step_id": "pay"}
    # Nothing was sent for the second: no POST carried its step's key.
    assert step.evidence["repeat_of_task"] == first.workflow_id
    assert len([r for r in await control.requests() if r.method == "POST"]) == 1


async def test_a_repeat_of_a_parked_charge_sends_nothing_and_names_the_parked_call(
    worker: Worker, tasks: TaskClient, control: ProviderControl
) -> None:
    charge = order("parked")
    await control.configure(search_lag_seconds=3600)
    await control.add_fault(Fault.ERROR_500_AFTER_COMMIT, path_prefix="/v1/payment_intents")
    await control.add_fault(
        Fault.ERROR_503, method="GET", path_prefix="/v1/payment_intents", times=None
    )
    parked_id = await start_task(tasks, ("pay", "charge_payment", charge))
    await eventually(
        lambda: tasks.status(parked_id),
        until=lambda status: status.state is TaskState.PARKED,
        what="the first charge parks",
        timeout=120,
    )
    await control.clear_faults()
    posts_before = len([r for r in await control.requests() if r.method == "POST"])

    repeat = await tasks.result(await start_task(tasks, ("pay", "charge_payment", charge)))

    step = repeat.step("pay")
    assert repeat.state is TaskState.FAILED and step.state is StepState.FAILED
    assert [attempt.outcome for attempt in step.attempts] == [OutcomeClass.REJECTED]
    assert f"held by task {parked_id}, step pay" in (step.failure_reason or "")
    assert step.evidence["repeat_of_task"] == parked_id
    assert len(await charge_intents(control)) == 1  # the parked call's, and no other
    assert len([r for r in await control.requests() if r.method == "POST"]) == posts_before


async def test_a_declined_charge_frees_its_intent_for_the_next_attempt(
    worker: Worker, tasks: TaskClient, control: ProviderControl
) -> None:
    charge = order("declined")
    declined = await tasks.result(
        await start_task(
            tasks, ("pay", "charge_payment", {**charge, "payment_method": "pm_card_chargeDeclined"})
        )
    )
    assert declined.state is TaskState.FAILED
    retried = await tasks.result(await start_task(tasks, ("pay", "charge_payment", charge)))

    assert retried.state is TaskState.SUCCEEDED, retried.failure_reason
    assert "repeat_of" not in retried.step("pay").result
    assert await charge_intents(control) == [retried.step("pay").resource_id]


async def test_a_deliberate_repeat_makes_a_second_charge_and_is_recorded(
    worker: Worker, tasks: TaskClient, control: ProviderControl, database: str
) -> None:
    charge = order("deliberate")
    workflow_id = f"deliberate-{uuid.uuid4().hex[:8]}"
    await tasks.start(
        AgentTaskInput(tenant=TENANT, principal="agent-7", open=OpenTaskOptions()),
        workflow_id=workflow_id,
    )
    first = await tasks.call(
        workflow_id, CallInput(call_id="c1", tool="charge_payment", arguments=charge)
    )
    again = await tasks.call(
        workflow_id,
        CallInput(call_id="c2", tool="charge_payment", arguments=charge, deliberate_repeat=True),
    )
    await tasks.close(workflow_id)

    assert first.call.state is StepState.SUCCEEDED and again.call.state is StepState.SUCCEEDED
    assert again.repeat_of is None and again.call.resource_id != first.call.resource_id
    assert sorted(await charge_intents(control)) == sorted(
        [first.call.resource_id, again.call.resource_id]
    )
    with psycopg.connect(database) as conn:
        recorded = conn.execute(
            "SELECT workflow_id, step_id FROM intent_deliberate_repeats"
        ).fetchall()
    assert recorded == [(workflow_id, "c2")]


async def test_concurrent_identical_intents_under_distinct_keys_make_one_charge_each(
    dev_server: WorkflowEnvironment,
    worker_process: WorkerProcess,
    admitting: AdmittingClient,
    control: ProviderControl,
) -> None:
    # Two worker processes, twelve tasks started at once for three intents, interleaved.
    await worker_process()
    await worker_process()
    tasks = admitting()
    intents = [order(name) for name in ("a", "b", "c")]
    plan = [intents[n % 3] for n in (0, 0, 1, 0, 2, 1, 1, 2, 0, 2, 1, 0)]
    started = await asyncio.gather(
        *(
            start_task(tasks, ("pay", "charge_payment", charge), budget=CONVERGING)
            for charge in plan
        )
    )
    results = await asyncio.gather(*(tasks.result(workflow_id) for workflow_id in started))

    ledger = await control.ledger()
    by_order = {
        charge["order_id"]: [
            e.object_id for e in ledger if e.metadata.get("order_id") == charge["order_id"]
        ]
        for charge in intents
    }
    assert {order_id: len(ids) for order_id, ids in by_order.items()} == {
        charge["order_id"]: 1 for charge in intents
    }, ledger
    for charge, result in zip(plan, results, strict=True):
        # Every task answers with its intent's one charge (the holder's, or the repeat's
        # answer once the holder's effect is known).
        assert result.state is TaskState.SUCCEEDED, result.failure_reason
        assert result.step("pay").resource_id == by_order[charge["order_id"]][0]
