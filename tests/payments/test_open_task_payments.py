"""An open task's payment calls, judged by the provider's ledger: calls side by side,
and a worker process SIGKILLed in the middle of one."""

import asyncio
import os
import signal
import uuid

import pytest
from onceflow_devstack.stripe_provider import Fault, ProviderControl

from onceflow.task_api import TaskClient
from onceflow.workflows.task_models import (
    AgentTaskInput,
    CallInput,
    OpenTaskOptions,
    StepState,
    TaskState,
)
from tests.harness import eventually

from .conftest import FAST_BUDGET, TENANT, VISA_CHARGE, WorkerProcess

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]


def charge(call_id: str, order_id: str) -> CallInput:
    return CallInput(
        call_id=call_id, tool="charge_payment", arguments={**VISA_CHARGE, "order_id": order_id}
    )


async def test_parallel_charges_survive_a_worker_killed_mid_call_with_one_charge_each(
    worker_process: WorkerProcess, tasks: TaskClient, control: ProviderControl
) -> None:
    first = await worker_process()
    workflow_id = f"open-{uuid.uuid4().hex}"
    opened = AgentTaskInput(
        tenant=TENANT, principal="agent-7", budget=FAST_BUDGET, open=OpenTaskOptions()
    )
    await tasks.call(workflow_id, charge("warm-up", "ord-0"), start=opened)
    # One charge commits at the provider, then its answer is held long enough to kill
    # the worker; the other runs beside it.
    await control.add_fault(
        Fault.DELAY_AFTER_COMMIT, path_prefix="/v1/payment_intents", delay_seconds=30
    )
    calls = [
        asyncio.create_task(tasks.call(workflow_id, charge(f"c{n}", f"ord-{n}"))) for n in (1, 2)
    ]
    await eventually(
        control.ledger,
        until=lambda ledger: len(ledger) == 3,
        what="both charges committed at the provider",
        interval=0.02,
    )
    os.kill(first.pid, signal.SIGKILL)
    await first.wait()
    await control.clear_faults()
    await worker_process()

    # Only a bound for a hang: the held request settles after its 30 s delay, the new
    # worker starts, the dead one's sticky queue times out; on a loaded machine all of
    # that has taken more than 60 s.
    answers = await asyncio.wait_for(asyncio.gather(*calls), timeout=300)

    assert [a.call.state for a in answers] == [StepState.SUCCEEDED] * 2
    ledger = await control.ledger()
    assert sorted(entry.metadata.get("order_id") for entry in ledger) == [
        "ord-0",
        "ord-1",
        "ord-2",
    ]
    assert {a.call.resource_id for a in answers} == {
        entry.object_id for entry in ledger if entry.metadata.get("order_id") != "ord-0"
    }
    await tasks.close(workflow_id)
    result = await tasks.result(workflow_id)
    assert result.state is TaskState.CLOSED
    ids = [c.step_id for c in result.steps]
    assert ids[0] == "warm-up" and sorted(ids[1:]) == ["c1", "c2"]
