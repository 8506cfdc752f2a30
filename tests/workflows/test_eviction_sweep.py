"""A task evicted from a worker's cache at any point decides as it would have cached.

A representative open task (a retried call, a repeat answered by it, a call parked and
decided, a call approved, a close) runs twice: on a worker that caches it and on one
that caches nothing (every workflow task replays the whole history so far, as after an
eviction). Both end with the same calls, attempts and decisions. Then its history is
cut before every workflow task (where an eviction leaves a task: the next worker replays
what came before and runs that workflow task live) and every cut replays.
"""

import uuid
from datetime import timedelta
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker
from temporalio.workflow import NondeterminismError

from onceflow.plugin import OnceflowPlugin
from onceflow.retry_policy import OutcomeClass, RetryBudget
from onceflow.task_api import TaskClient
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.task_models import (
    AgentTaskInput,
    ApproveInput,
    CallInput,
    OpenTaskOptions,
    ReconcileDecision,
    ReconcileInput,
    StepState,
    TaskState,
    TaskStatus,
)
from tests.harness import eventually

from .scripted_tools import NEEDS_APPROVAL, SAFE, UNSAFE, Script

BUDGET = RetryBudget(initial_backoff=timedelta(milliseconds=100), max_backoff=timedelta(seconds=1))
T, U, S = OutcomeClass.TRANSIENT, OutcomeClass.UNKNOWN, OutcomeClass.SUCCEEDED


async def representative_task(
    env: WorkflowEnvironment, task_queue: str, script: Script, run: str
) -> str:
    """Run the representative open task to its end; its workflow id."""
    tasks = TaskClient(env.client, task_queue=task_queue)
    workflow_id = f"sweep-{run}-{uuid.uuid4().hex[:8]}"
    handle = await tasks.start(
        AgentTaskInput(tenant="acme", principal="agent-1", budget=BUDGET, open=OpenTaskOptions()),
        workflow_id=workflow_id,
    )

    def call(call_id: str, tool: str, **arguments: Any) -> CallInput:
        return CallInput(call_id=call_id, tool=tool, arguments=arguments)

    retried = await tasks.call(
        workflow_id, call("c1", SAFE.name, label=script.plan(f"{run}-1", T, S))
    )
    assert retried.call.state is StepState.SUCCEEDED
    repeat = await tasks.call(workflow_id, call("c2", SAFE.name, label=f"{run}-1"))
    assert repeat.repeat_of == "c1"
    parked = await tasks.call(
        workflow_id, call("c3", UNSAFE.name, label=script.plan(f"{run}-3", U, S))
    )
    assert parked.call.state is StepState.PARKED
    await handle.execute_update(
        AgentTaskWorkflow.reconcile,
        ReconcileInput(
            step_id="c3",
            decision=ReconcileDecision.DID_NOT_HAPPEN,
            operator="ops",
            reason="checked",
        ),
    )
    gated = await tasks.call(
        workflow_id, call("c4", NEEDS_APPROVAL.name, label=f"{run}-4", amount=900)
    )
    assert gated.call.state is StepState.AWAITING_APPROVAL
    await handle.execute_update(
        AgentTaskWorkflow.approve,
        ApproveInput(
            step_id="c4",
            approved=True,
            approver="cfo",
            reason="fine",
            arguments_digest=gated.call.arguments_digest,
        ),
    )
    for call_id in ("c3", "c4"):
        await eventually(
            lambda call_id=call_id: handle.query(AgentTaskWorkflow.status),
            until=lambda status, call_id=call_id: status.step(call_id).state is StepState.SUCCEEDED,
            what=f"call {call_id} succeeded",
        )
    await tasks.close(workflow_id)
    return workflow_id


def outcome(status: TaskStatus) -> list[Any]:
    """What the task did, without its ids and times."""
    return [
        status.state,
        [
            (
                call.step_id,
                call.state,
                call.repeat_of,
                [(attempt.outcome, attempt.operator_authorised) for attempt in call.attempts],
            )
            for call in status.steps
        ],
        [(d.kind, d.step_id, d.decision, d.accepted) for d in status.decisions],
        (status.budget.attempts_used, status.budget.operator_authorised_attempts),
    ]


async def test_a_task_evicted_before_any_workflow_task_decides_as_a_cached_one(
    dev_server: WorkflowEnvironment, task_queue: str, script: Script
) -> None:
    ended: dict[str, TaskStatus] = {}
    for run, cache in (("cached", 1000), ("evicted", 0)):
        async with Worker(
            dev_server.client,
            task_queue=task_queue,
            workflows=[AgentTaskWorkflow],
            activities=script.activities(),
            max_cached_workflows=cache,
        ):
            workflow_id = await representative_task(dev_server, task_queue, script, run)
            tasks = TaskClient(dev_server.client, task_queue=task_queue)
            ended[run] = await tasks.result(workflow_id)
    assert ended["cached"].state is TaskState.CLOSED
    assert outcome(ended["evicted"]) == outcome(ended["cached"])

    history = await dev_server.client.get_workflow_handle(
        ended["cached"].workflow_id
    ).fetch_history()
    cuts = [
        WorkflowHistory(history.workflow_id, history.events[: index + 1])
        for index, event in enumerate(history.events)
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
    ]
    assert len(cuts) >= 10, f"a representative task has many workflow tasks, not {len(cuts)}"
    replayer = Replayer(
        workflows=[], plugins=[OnceflowPlugin(workflows=[AgentTaskWorkflow], strict_sandbox=True)]
    )
    failures = []
    for number, cut in enumerate(cuts):
        result = await replayer.replay_workflow(cut, raise_on_replay_failure=False)
        if result.replay_failure is not None:
            failures.append(f"cut before workflow task {number + 1}: {result.replay_failure}")
    assert failures == [], failures
    # The control: the same replay of a cut whose first attempt names another tool fails.
    altered = cuts[-1].events
    scheduled = next(
        event
        for event in altered
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    )
    scheduled.activity_task_scheduled_event_attributes.activity_type.name = UNSAFE.name
    control = await replayer.replay_workflow(
        WorkflowHistory(history.workflow_id, altered), raise_on_replay_failure=False
    )
    assert isinstance(control.replay_failure, NondeterminismError), control.replay_failure
