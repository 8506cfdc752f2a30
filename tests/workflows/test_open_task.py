"""Open tasks on the Temporal dev server: calls arrive one by one as Updates, each a step
under the task's one budget, with the repeat guard, parking, closing and continue-as-new.

The scripted tools decide how each attempt ends and count the attempts that ran: the
far side's record for these tests.
"""

import asyncio
import gc
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.retry_policy import OutcomeClass, RetryBudget
from onceflow.task_api import CallRefused, TaskClient
from onceflow.tools.worker import UnknownTool
from onceflow.workflows.task_models import (
    AgentTaskInput,
    CallInput,
    OpenTaskOptions,
    ReconcileDecision,
    ReconcileInput,
    StepState,
    TaskState,
)
from onceflow.workflows.visibility import TASK_KIND, TASK_STATE

from .conftest import scripted_worker
from .scripted_tools import Script

S, T, U = OutcomeClass.SUCCEEDED, OutcomeClass.TRANSIENT, OutcomeClass.UNKNOWN
QUICK = RetryBudget(
    max_attempts_per_task=6,
    max_attempts_per_step=3,
    initial_backoff=timedelta(milliseconds=20),
    max_backoff=timedelta(milliseconds=50),
)


@pytest.fixture
async def worker(
    dev_server: WorkflowEnvironment, task_queue: str, script: Script
) -> AsyncIterator[Worker]:
    async with scripted_worker(dev_server, task_queue, script) as running:
        yield running


@pytest.fixture
def tasks(dev_server: WorkflowEnvironment, task_queue: str) -> TaskClient:
    return TaskClient(dev_server.client, task_queue=task_queue)


def open_task(budget: RetryBudget = QUICK, **options: object) -> AgentTaskInput:
    return AgentTaskInput(
        tenant="acme",
        principal="agent-1",
        budget=budget,
        open=OpenTaskOptions.model_validate(options),
    )


def call(call_id: str, label: str, tool: str = "scripted_safe", **more: object) -> CallInput:
    return CallInput.model_validate(
        {"call_id": call_id, "tool": tool, "arguments": {"label": label}, **more}
    )


async def started(tasks: TaskClient, **options: object) -> str:
    workflow_id = f"open-{uuid.uuid4().hex}"
    await tasks.start(open_task(**options), workflow_id=workflow_id)  # type: ignore[arg-type]
    return workflow_id


async def test_calls_run_one_by_one_under_one_budget_and_a_repeat_is_answered_not_run(
    worker: Worker, tasks: TaskClient, script: Script
) -> None:
    workflow_id = f"open-{uuid.uuid4().hex}"
    # The first call starts the task (Update-with-Start).
    first = await tasks.call(workflow_id, call("c1", script.plan("a", T, S)), start=open_task())
    assert first.call.state is StepState.SUCCEEDED and first.repeat_of is None
    assert [a.outcome for a in first.call.attempts] == [T, S]

    # The model picks the same tool with the same arguments again, under a new call id.
    again = await tasks.call(workflow_id, call("c2", "a"))
    assert again.repeat_of == "c1" and again.call.state is StepState.SUCCEEDED
    assert again.call.result == first.call.result and again.call.step_id == "c2"
    # The caller resends its own call (its answer was lost): the same call, not a new one.
    resent = await tasks.call(workflow_id, call("c1", "a"))
    assert resent.call.attempts == first.call.attempts
    assert script.attempts("a") == 2  # T then S: nothing ran for c2 or the resend
    # A deliberate repeat runs, and says so.
    deliberate = await tasks.call(workflow_id, call("c3", "a", deliberate_repeat=True))
    assert deliberate.repeat_of is None and deliberate.call.deliberate_repeat
    assert script.attempts("a") == 3
    # A tool may forbid deliberate repeats.
    once = await tasks.call(workflow_id, call("o1", script.plan("once", S), "scripted_once_only"))
    assert once.call.state is StepState.SUCCEEDED
    with pytest.raises(CallRefused, match="does not allow deliberate repeats"):
        await tasks.call(
            workflow_id, call("o2", "once", "scripted_once_only", deliberate_repeat=True)
        )
    # The same call id for another call is refused before anything is recorded.
    with pytest.raises(CallRefused, match="was used for another call"):
        await tasks.call(workflow_id, call("c1", "other"))
    # An unknown tool is refused before it is sent; invalid arguments by the task.
    with pytest.raises(UnknownTool, match="no_such_tool"):
        await tasks.call(workflow_id, call("c4", "x", tool="no_such_tool"))
    with pytest.raises(CallRefused, match="invalid arguments"):
        await tasks.call(
            workflow_id, CallInput(call_id="c4", tool="scripted_safe", arguments={"nope": 1})
        )

    closed = await tasks.close(workflow_id)
    assert closed.closing == "closed by the agent"
    result = await tasks.result(workflow_id)
    assert result.state is TaskState.CLOSED and result.open
    assert [(c.step_id, c.repeat_of) for c in result.steps] == [
        ("c1", None),
        ("c2", "c1"),
        ("c3", None),
        ("o1", None),
    ]
    assert result.budget.attempts_used == 1  # one budget: c1's retry (first attempts are free)
    with pytest.raises(CallRefused, match="ended|no more calls"):
        await tasks.call(workflow_id, call("c5", "b"))


async def test_a_spent_budget_refuses_further_calls_with_the_reason(
    worker: Worker, tasks: TaskClient, script: Script
) -> None:
    budget = QUICK.model_copy(update={"max_attempts_per_task": 3})
    workflow_id = f"open-{uuid.uuid4().hex}"
    # A provider that keeps failing: the task's retries go, whichever calls spend them.
    failing = await tasks.call(
        workflow_id, call("c1", script.plan("down", T)), start=open_task(budget)
    )
    assert failing.call.state is StepState.FAILED
    assert "3 of 3 attempts per step" in (failing.call.failure_reason or "")
    second = await tasks.call(workflow_id, call("c2", script.plan("down2", T)))
    assert "3 of 3 attempts per task" in (second.call.failure_reason or "")
    with pytest.raises(CallRefused, match="retry budget is spent"):
        await tasks.call(workflow_id, call("c3", script.plan("other", S)))
    assert script.attempts("down") == 3 and script.attempts("down2") == 2
    assert script.attempts("other") == 0
    status = await tasks.status(workflow_id)
    assert [c.state for c in status.steps] == [StepState.FAILED] * 2
    await tasks.close(workflow_id)
    assert (await tasks.result(workflow_id)).state is TaskState.CLOSED


async def test_a_failed_call_does_not_block_an_identical_new_one(
    worker: Worker, tasks: TaskClient, script: Script
) -> None:
    workflow_id = f"open-{uuid.uuid4().hex}"
    first = await tasks.call(
        workflow_id, call("c1", script.plan("flaky", T, T, T, S)), start=open_task()
    )
    assert first.call.state is StepState.FAILED
    second = await tasks.call(workflow_id, call("c2", "flaky"))
    assert second.repeat_of is None and second.call.state is StepState.SUCCEEDED
    await tasks.close(workflow_id)


async def test_a_parked_call_answers_at_once_and_the_waiting_call_gets_the_decision(
    dev_server: WorkflowEnvironment, worker: Worker, tasks: TaskClient, script: Script
) -> None:
    workflow_id = await started(tasks)
    parked = await tasks.call(workflow_id, call("pay", script.plan("p", U), tool="scripted_unsafe"))
    assert parked.call.state is StepState.PARKED and parked.task_state is TaskState.PARKED
    assert parked.call.reconcile_command and "--step pay" in parked.call.reconcile_command
    # Meanwhile the agent goes on with other calls.
    other = await tasks.call(workflow_id, call("look", script.plan("l", S)))
    assert other.call.state is StepState.SUCCEEDED and other.task_state is TaskState.PARKED
    # What the Temporal UI shows: the calls so far, and the parked one's evidence and
    # the exact command; search attributes tell an open task and its state.
    handle = dev_server.client.get_workflow_handle(workflow_id)
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    details = metadata.current_details
    assert details.startswith("Open task: 2 calls\n- pay: scripted_unsafe parked")
    assert "- look: scripted_safe succeeded" in details
    assert f"`onceflow reconcile {workflow_id} --step pay --decision" in details
    attributes = (await handle.describe()).typed_search_attributes
    assert attributes.get(TASK_KIND) == "open" and attributes.get(TASK_STATE) == "parked"
    # The agent waits for the person; the operator decides.
    waiting = asyncio.create_task(
        tasks.call(
            workflow_id,
            call("pay", "p", tool="scripted_unsafe", wait_until_ended=True),
        )
    )
    await tasks.reconcile(
        workflow_id,
        ReconcileInput(
            step_id="pay",
            decision=ReconcileDecision.HAPPENED,
            resource_id="res-by-hand",
            operator="ops",
            reason="found it",
        ),
    )
    decided = await asyncio.wait_for(waiting, timeout=20)
    assert decided.call.state is StepState.SUCCEEDED
    assert decided.call.resource_id == "res-by-hand"
    assert script.attempts("p") == 1
    await tasks.close(workflow_id)
    assert (await tasks.result(workflow_id)).state is TaskState.CLOSED


async def test_parallel_calls_run_side_by_side_and_an_idle_task_closes(
    worker: Worker, tasks: TaskClient, script: Script
) -> None:
    workflow_id = await started(tasks, idle_timeout=timedelta(seconds=1))
    answers = await asyncio.gather(
        *(tasks.call(workflow_id, call(f"c{n}", script.plan(f"p{n}", S))) for n in range(4))
    )
    assert [a.call.state for a in answers] == [StepState.SUCCEEDED] * 4
    result = await asyncio.wait_for(tasks.result(workflow_id), timeout=20)
    assert result.state is TaskState.CLOSED and result.closing == "idle for 0:00:01"
    assert sorted(c.step_id for c in result.steps) == ["c0", "c1", "c2", "c3"]
    assert all(script.attempts(f"p{n}") == 1 for n in range(4))


async def test_calls_one_after_another_cost_no_timer_or_upsert_of_their_own(
    worker: Worker, tasks: TaskClient, script: Script
) -> None:
    """What Temporal Cloud bills beyond the calls themselves: the start sets the task's
    attributes (free), one timer waits for its idle end through every call, and a call
    adds no timer; the task still closes when idle, by that timer re-armed once."""
    workflow_id = await started(tasks, idle_timeout=timedelta(seconds=2))
    for n in range(4):
        answer = await tasks.call(workflow_id, call(f"c{n}", script.plan(f"q{n}", S)))
        assert answer.call.state is StepState.SUCCEEDED
    result = await asyncio.wait_for(tasks.result(workflow_id), timeout=30)
    assert result.state is TaskState.CLOSED and result.closing == "idle for 0:00:02"

    history = await worker.client.get_workflow_handle(workflow_id).fetch_history()
    timers = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
    upserted = [
        set(e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields)
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
    ]
    # Four calls in well under the idle timeout: the first timer fires early at most once
    # (its end moved) and is armed again for the rest; before 0.4.0, one per call.
    assert 1 <= len(timers) <= 2, len(timers)
    # No upsert of what the start set; the tools once; not the end's state, which the
    # close status says (since 0.6.0). The SDK's own TemporalChangeVersion (the patch
    # marker's) is not billed.
    billed = [fields - {"TemporalChangeVersion"} for fields in upserted]
    assert [fields for fields in billed if fields] == [{"OnceflowTools"}]


async def test_a_long_task_continues_as_new_without_losing_a_call_or_its_guard(
    dev_server: WorkflowEnvironment, worker: Worker, tasks: TaskClient, script: Script
) -> None:
    workflow_id = await started(tasks, calls_per_run=3)
    answers = []
    for n in range(7):
        answers.append(await tasks.call(workflow_id, call(f"c{n}", script.plan(f"l{n}", S))))
    # Calls sent side by side while the task is due to continue as new.
    answers += await asyncio.gather(
        *(tasks.call(workflow_id, call(f"p{n}", script.plan(f"q{n}", S))) for n in range(3))
    )
    # The guard remembers a call of the first run.
    repeat = await tasks.call(workflow_id, call("again", "l0"))
    assert repeat.repeat_of == "c0"
    await tasks.close(workflow_id)
    result = await tasks.result(workflow_id)

    assert result.runs >= 3
    ids = [c.step_id for c in result.steps]
    assert ids[:7] == [f"c{n}" for n in range(7)] and ids[-1] == "again"
    assert sorted(ids[7:10]) == ["p0", "p1", "p2"]
    assert all(c.state is StepState.SUCCEEDED for c in result.steps)
    assert all(script.attempts(f"l{n}") == 1 for n in range(7))
    assert all(script.attempts(f"q{n}") == 1 for n in range(3))
    assert result.budget.attempts_used == 0  # no call needed a retry
    handle = dev_server.client.get_workflow_handle(workflow_id, run_id=None)
    history = await handle.fetch_history()
    assert not any(
        e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED for e in history.events
    )


async def test_bursts_of_calls_across_a_continue_as_new_after_every_call_are_each_answered_once(
    worker: Worker, tasks: TaskClient, script: Script
) -> None:
    workflow_id = await started(tasks, calls_per_run=1)
    for burst in range(3):
        # A burst arrives while the run that took the previous burst continues as new.
        answers = await asyncio.gather(
            *(
                tasks.call(workflow_id, call(f"b{burst}c{n}", script.plan(f"b{burst}l{n}", S)))
                for n in range(8)
            )
        )
        assert [a.call.state for a in answers] == [StepState.SUCCEEDED] * 8
    await tasks.close(workflow_id)
    result = await tasks.result(workflow_id)
    assert result.runs >= 3 and len(result.steps) == 24
    assert all(script.attempts(f"b{b}l{n}") == 1 for b in range(3) for n in range(8))


async def test_a_call_decided_after_a_long_wait_does_not_leave_the_agent_a_closed_task(
    worker: Worker, tasks: TaskClient, script: Script
) -> None:
    workflow_id = await started(tasks, idle_timeout=timedelta(seconds=1))
    parked = await tasks.call(workflow_id, call("pay", script.plan("slow", U), "scripted_unsafe"))
    assert parked.call.state is StepState.PARKED
    await asyncio.sleep(1.5)  # scenario: the person decides after the idle timeout
    await tasks.reconcile(
        workflow_id,
        ReconcileInput(
            step_id="pay",
            decision=ReconcileDecision.HAPPENED,
            resource_id="res-slow",
            operator="ops",
            reason="found it",
        ),
    )
    # The idle clock restarted when the call ended: the agent's next call is taken.
    following = await tasks.call(workflow_id, call("next", script.plan("n", S)))
    assert following.call.state is StepState.SUCCEEDED
    await tasks.close(workflow_id)


async def test_a_task_evicted_with_a_call_in_flight_is_collected_without_an_error(
    dev_server: WorkflowEnvironment, task_queue: str, script: Script
) -> None:
    """An evicted task's pending call is closed by the garbage collector, outside the
    workflow: it must not call workflow APIs then. (An error there is printed as an
    unraisable exception, whose traceback formatting inside another thread's parsing
    broke Python 3.11's AST recursion counter in CI.)"""
    tasks = TaskClient(dev_server.client, task_queue=task_queue)
    unraisable: list[str] = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda seen: unraisable.append(f"{seen.object!r}: {seen.exc_value!r}")
    try:
        async with scripted_worker(dev_server, task_queue, script):
            workflow_id = await started(tasks)
            parked = await tasks.call(
                workflow_id, call("pay", script.plan("p", U), tool="scripted_unsafe")
            )
            assert parked.call.state is StepState.PARKED
        # The worker is gone and the task with it, its parked call still awaiting a decision.
        gc.collect()
    finally:
        sys.unraisablehook = previous
    assert unraisable == []


@pytest.mark.parametrize(("parallel", "per_task"), [(5, 3), (8, 1), (3, 6), (10, 4)])
async def test_parallel_calls_against_a_failing_provider_make_at_most_n_plus_b_attempts(
    worker: Worker, tasks: TaskClient, script: Script, parallel: int, per_task: int
) -> None:
    # Every attempt fails transiently; the calls decide their retries in whatever order
    # their attempts end. N first attempts are free, the task's B retries are shared.
    budget = QUICK.model_copy(
        update={"max_attempts_per_task": per_task, "max_attempts_per_step": per_task}
    )
    workflow_id = await started(tasks, budget=budget)
    labels = [script.plan(f"down-{parallel}-{per_task}-{n}", T) for n in range(parallel)]
    answers = await asyncio.gather(
        *(tasks.call(workflow_id, call(f"c{n}", label)) for n, label in enumerate(labels))
    )
    assert {answer.call.state for answer in answers} == {StepState.FAILED}
    made = sum(script.attempts(label) for label in labels)
    assert made <= parallel + per_task, f"{made} attempts for {parallel} calls, budget {per_task}"
    status = await tasks.status(workflow_id)
    assert status.budget.attempts_used == made - parallel <= per_task
    await tasks.close(workflow_id)
