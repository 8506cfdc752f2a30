"""A task decides on replay exactly as it did live, whoever asked about it meanwhile.

When a task's first workflow task carries a query (an agent asked for the task's status
while no worker polled: after a Temporal restart, a worker outage, a backlog), Core
answers the query, completes the workflow task early and delivers a local activity's
result in the next one; on replay it resolves that result from its marker inside the
first. A time read right after the local activity then differs between the two, and so
does every deadline counted from it (the key's send-by, the first attempt's age): the
task's first replay decides otherwise and the task is stuck for good.

A task admitted through ``TaskClient`` carries its policies, so no local activity runs
before its first attempt; a task started by hand without them is refused (before 0.3.0
it pinned them with one and counted from the time before it: its saved histories
replay). Each test compares what the task recorded live with what a worker that caches
nothing rebuilds from its history (its status query, after the task ended, replays the
whole history).

A live worker may also read an earlier workflow task's time (seen after a Temporal
restart): the key's window is decided by a timer, never by comparing that clock.
"""

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import datetime, timedelta

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowHandle, WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from onceflow.plugin import OnceflowPlugin
from onceflow.retry_policy import OutcomeClass, RetryBudget
from onceflow.task_api import CallRefused, TaskClient
from onceflow.tools.worker import CATALOGUE
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.task_models import (
    AgentTaskInput,
    CallInput,
    OpenTaskOptions,
    StepInput,
    TaskState,
    TaskStatus,
)
from tests.harness import eventually
from tests.harness._replay_all import replay_histories

from .scripted_tools import PROVIDER_KEYED, Script

LOCAL_ACTIVITY_MARKER = "core_local_activity"
LEADS = (0.5, 1.0, 2.0, 4.0)
"""How long the agent's query waits before a worker polls, one round each until the
history shows the scenario happened."""

Handle = WorkflowHandle[AgentTaskWorkflow, TaskStatus]


def a_plan(label: str) -> AgentTaskInput:
    return AgentTaskInput(
        tenant="acme",
        principal="agent-1",
        steps=[StepInput(step_id="pay", tool=PROVIDER_KEYED.name, arguments={"label": label})],
    )


async def run_with_a_query_waiting(
    env: WorkflowEnvironment, task_queue: str, script: Script, handle: Handle, lead: float
) -> TaskStatus:
    """Ask for the task's status while no worker polls, then let a worker take the task;
    the task's result as it was recorded live."""
    asked = asyncio.create_task(handle.query(AgentTaskWorkflow.status))
    await asyncio.sleep(lead)  # scenario: no worker polls while the agent's query waits
    async with Worker(
        env.client,
        task_queue=task_queue,
        workflows=[AgentTaskWorkflow],
        activities=script.activities(),
    ):
        live = await handle.result()
        await asked
    return live


async def replayed_status(
    env: WorkflowEnvironment, task_queue: str, script: Script, handle: Handle
) -> TaskStatus:
    """The status a worker caching nothing rebuilds from the ended task's history."""
    async with Worker(
        env.client,
        task_queue=task_queue,
        workflows=[AgentTaskWorkflow],
        activities=script.activities(),
        max_cached_workflows=0,
    ):
        return await handle.query(AgentTaskWorkflow.status)


async def pin_answered_a_task_late(handle: Handle) -> bool | None:
    """Whether the task's first attempt was scheduled a workflow task after the one that
    recorded the pin's marker (the scenario); None when no local activity pinned."""
    pinned = late = False
    async for event in handle.fetch_history_events():
        if (
            event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
            and event.marker_recorded_event_attributes.marker_name == LOCAL_ACTIVITY_MARKER
        ):
            pinned = True
        elif pinned and event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            late = True
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            break
    return late if pinned else None


async def test_an_admitted_task_runs_no_local_activity_and_replays_its_attempts_exactly(
    dev_server: WorkflowEnvironment, task_queue: str, script: Script
) -> None:
    tasks = TaskClient(dev_server.client, task_queue=task_queue)
    handle = await tasks.start(
        a_plan(script.plan("admitted")), workflow_id=f"admitted-{uuid.uuid4().hex}"
    )
    live = await run_with_a_query_waiting(dev_server, task_queue, script, handle, LEADS[0])
    assert live.state is TaskState.SUCCEEDED
    assert live.policies[PROVIDER_KEYED.name].tool == PROVIDER_KEYED.name
    assert await pin_answered_a_task_late(handle) is None
    replayed = await replayed_status(dev_server, task_queue, script, handle)
    assert replayed.step("pay").attempts == live.step("pay").attempts


async def test_a_task_started_by_hand_is_refused_before_it_pins_anything(
    dev_server: WorkflowEnvironment, task_queue: str, script: Script
) -> None:
    # Before 0.3.0 it pinned its policies with a local activity and counted from the time
    # before it; those tasks replay from their saved histories (by_hand_*.json).
    handle = await dev_server.client.start_workflow(
        AgentTaskWorkflow.run,
        a_plan(script.plan("by-hand")),
        id=f"by-hand-{uuid.uuid4().hex}",
        task_queue=task_queue,
    )
    with pytest.raises(WorkflowFailureError):
        await run_with_a_query_waiting(dev_server, task_queue, script, handle, LEADS[0])
    assert await pin_answered_a_task_late(handle) is None  # no local activity ran
    assert script.attempts("by-hand") == 0


PARALLEL_TOOLS = ("scripted_safe", "scripted_unsafe", "scripted_provider", "scripted_verified")
ROUNDS = 40
"""Open tasks, each taking its first call of every tool at once, a close racing them
(200 rounds of each kind replayed here; 40 keep the guard in CI)."""


async def one_round(tasks: TaskClient, script: Script, number: int) -> str:
    """An open task whose agent sends a first call of each tool at once (a model's
    parallel tool calls) and closes the task while they run; its workflow id."""
    workflow_id = f"parallel-{number}-{uuid.uuid4().hex}"
    await tasks.start(
        AgentTaskInput(tenant="acme", principal="agent-1", open=OpenTaskOptions()),
        workflow_id=workflow_id,
    )
    calls = [
        CallInput(call_id=f"c{n}", tool=tool, arguments={"label": f"p{number}-{n}"})
        for n, tool in enumerate(PARALLEL_TOOLS)
    ]
    answers = await asyncio.gather(
        *(tasks.call(workflow_id, call) for call in calls),
        tasks.close(workflow_id),
        return_exceptions=True,
    )
    for answer in answers:
        assert not isinstance(answer, Exception) or isinstance(answer, CallRefused), answer
    await tasks.result(workflow_id)
    return workflow_id


async def test_parallel_first_calls_of_several_tools_and_a_racing_close_replay(
    dev_server: WorkflowEnvironment, task_queue: str, script: Script
) -> None:
    # Each call carries its policy (a call without one is refused by the validator).
    tasks = TaskClient(dev_server.client, task_queue=task_queue, catalogue=CATALOGUE)
    async with Worker(
        dev_server.client,
        task_queue=task_queue,
        workflows=[AgentTaskWorkflow],
        activities=script.activities(),
    ):
        ids = []
        for batch in range(0, ROUNDS, 20):
            ids += await asyncio.gather(
                *(one_round(tasks, script, n) for n in range(batch, batch + 20))
            )
    histories = [await dev_server.client.get_workflow_handle(i).fetch_history() for i in ids]
    replayer = Replayer(
        workflows=[], plugins=[OnceflowPlugin(workflows=[AgentTaskWorkflow], strict_sandbox=True)]
    )
    failures = []
    async with replayer.workflow_replay_iterator(iter_histories(histories)) as replays:
        async for result in replays:
            if result.replay_failure is not None:
                failures.append(f"{result.history.workflow_id}: {result.replay_failure}")
    assert failures == [], f"{len(failures)} of {ROUNDS} did not replay: {failures[:3]}"


async def iter_histories(histories: Iterable[WorkflowHistory]) -> AsyncIterator[WorkflowHistory]:
    for history in histories:
        yield history


class LaggingClock:
    """``workflow.now()`` as a live worker read it in a chaos run, running the task on
    events a query carried before any workflow task delivered them (the workers' runner
    now refuses that: ``test_undelivered_events.py``): the time of the workflow task before
    the one running. A replay reads the running task's time."""

    def __init__(self, read: Callable[[], datetime]) -> None:
        self._read = read
        self._tasks: dict[str, tuple[datetime, datetime]] = {}
        """Per run: (the previous workflow task's time, the running one's)."""

    def __call__(self) -> datetime:
        now, run = self._read(), workflow.info().run_id
        previous, current = self._tasks.get(run, (now, now))
        if now != current:
            previous, current = current, now
        self._tasks[run] = (previous, current)
        return previous


async def test_a_key_window_decided_on_a_lagging_live_clock_replays(
    dev_server: WorkflowEnvironment,
    task_queue: str,
    script: Script,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A key kept 3 s less a 1 s margin; the first attempt ends unknown after the window.
    window = timedelta(seconds=2)
    policy = PROVIDER_KEYED.policy().model_copy(
        update={"key_retention": timedelta(seconds=3), "retention_margin": timedelta(seconds=1)}
    )
    label = script.plan("lagging-clock", OutcomeClass.UNKNOWN, OutcomeClass.SUCCEEDED)
    script.slow[label] = window + timedelta(seconds=2)
    task = a_plan(label).model_copy(
        update={
            "policies": {PROVIDER_KEYED.name: policy},
            "budget": RetryBudget(max_backoff=timedelta(seconds=1)),
        }
    )
    handle = await dev_server.client.start_workflow(
        AgentTaskWorkflow.run, task, id=f"lagging-{uuid.uuid4().hex}", task_queue=task_queue
    )
    monkeypatch.setattr(workflow, "now", LaggingClock(workflow.now))
    async with Worker(
        dev_server.client,
        task_queue=task_queue,
        workflows=[AgentTaskWorkflow],
        activities=script.activities(),
    ):
        # Live, the decision after the attempt read the time before it: the key looked
        # fresh. The window's timer fired during the attempt: the step parks, no repeat.
        status = await eventually(
            lambda: handle.query(AgentTaskWorkflow.status),
            until=lambda status: status.state is TaskState.PARKED,
            what="the task parks",
        )
    monkeypatch.undo()
    assert script.attempts(label) == 1
    assert "send window of the step's key closed" in (status.step("pay").park_reason or "")
    report = await replay_histories(iter_histories([await handle.fetch_history()]), "dev")
    assert (report.replayed, report.diverged) == (1, [])
    await handle.terminate("test over")
