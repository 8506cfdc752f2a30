"""No worker keeps state built from events no workflow task delivered (``onceflow.plugin``).

The scenario of the chaos runs' ``Update machine does not handle this event:
ActivityTaskScheduled``, on the real Temporal dev server: a query reaches a task while no
workflow task is pending and waits for a worker; meanwhile a timer fires and an Update
arrives; a worker then takes the query (with the whole history: the fired timer included)
before the workflow task that delivers both. Core runs the workflow on the fired timer to
answer the query; the next workflow task then records the activity that followed the timer
before accepting the Update, and a replay accepts the Update first.
"""

import asyncio
import uuid
from datetime import timedelta

from temporalio.api.enums.v1 import EventType, UpdateWorkflowExecutionLifecycleStage
from temporalio.api.update.v1 import UpdateRef, WaitPolicy
from temporalio.api.workflowservice.v1 import PollWorkflowExecutionUpdateRequest
from temporalio.client import WorkflowHandle, WorkflowQueryFailedError
from temporalio.common import WorkflowIDReusePolicy
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from onceflow.plugin import UNDELIVERED_EVENTS_REFUSAL, DeliveredEventsRunner, OnceflowPlugin
from tests.harness import eventually

from .undelivered_events_workflow import CallsAfterATimer, Seen, answer

TIMERS = (2.0, 2.0, 2.0, 4.0, 4.0, 4.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0)
"""The first call's timer, one round each until the scenario happens: the query must be
sent before the timer fires (a longer timer leaves a slow machine more time), and taken
before the workflow task, which Temporal's matching does not always do (about one round
in three, whatever the timer). Twelve rounds: nine missed it once in a CI run beside two
other test processes (about 1 in 40 by that rate); the rounds after the first hit cost
nothing."""

Answer = Seen | WorkflowQueryFailedError


async def has_event(handle: WorkflowHandle, event_type: EventType.ValueType) -> bool:
    async for event in handle.fetch_history_events():
        if event.event_type == event_type:
            return True
    return False


async def admitted(handle: WorkflowHandle, update_id: str) -> bool:
    """Whether Temporal holds the Update (it answers "not found" until then)."""
    request = PollWorkflowExecutionUpdateRequest(
        namespace=handle._client.namespace,
        update_ref=UpdateRef(workflow_execution={"workflow_id": handle.id}, update_id=update_id),
        wait_policy=WaitPolicy(
            lifecycle_stage=UpdateWorkflowExecutionLifecycleStage.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ADMITTED
        ),
    )
    try:
        await handle._client.workflow_service.poll_workflow_execution_update(
            request, timeout=timedelta(seconds=5)
        )
    except RPCError:
        return False
    return True


async def one_round(
    env: WorkflowEnvironment, task_queue: str, runner: WorkflowRunner, timer: float
) -> tuple[WorkflowHandle, Answer]:
    """The ended task's handle and what its early query got."""
    client = env.client
    handle = await client.start_workflow(
        CallsAfterATimer.run,
        id=f"undelivered-{uuid.uuid4().hex}",
        task_queue=task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
    )
    # A worker caching nothing (so no sticky queue) starts the first call's timer.
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[CallsAfterATimer],
        activities=[answer],
        max_cached_workflows=0,
    ):
        first = asyncio.create_task(handle.execute_update(CallsAfterATimer.call, timer))
        await eventually(
            lambda: has_event(handle, EventType.EVENT_TYPE_TIMER_STARTED),
            until=bool,
            what="the first call's timer started",
        )
    # No workflow task pending: the query goes to the task queue at once and waits there.
    asked = asyncio.create_task(handle.query(CallsAfterATimer.seen))
    await eventually(
        lambda: has_event(handle, EventType.EVENT_TYPE_TIMER_FIRED),
        until=bool,
        what="the timer fired",
    )
    second = asyncio.create_task(handle.execute_update(CallsAfterATimer.call, 0, id="second"))
    await eventually(lambda: admitted(handle, "second"), until=bool, what="Temporal holds it")
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[CallsAfterATimer],
        activities=[answer],
        workflow_runner=runner,
        # One poll of the task queue at a time (the other polls its sticky queue): the query
        # that waited is taken before the workflow task.
        max_concurrent_workflow_task_polls=2,
    ):
        assert (await first, await second) == (1, 2)
        got: Answer
        try:
            got = await asked
        except WorkflowQueryFailedError as refused:
            got = refused
        await handle.signal(CallsAfterATimer.finish)
        assert await handle.result() == 2
    return handle, got


async def replay_failure(handle: WorkflowHandle) -> str | None:
    replayer = Replayer(
        workflows=[], plugins=[OnceflowPlugin(workflows=[CallsAfterATimer], strict_sandbox=True)]
    )
    result = await replayer.replay_workflow(
        await handle.fetch_history(), raise_on_replay_failure=False
    )
    return None if result.replay_failure is None else str(result.replay_failure)


def query_ran_on_undelivered_events(got: Answer) -> bool:
    """The scenario happened: the query saw the fired timer before the second call, which
    reached Temporal before any worker polled (refused, with the guard)."""
    if isinstance(got, WorkflowQueryFailedError):
        return UNDELIVERED_EVENTS_REFUSAL in str(got)
    return got == Seen(calls=1, timer_fired=True)


async def test_a_query_that_waited_for_a_worker_leaves_no_undelivered_state(
    dev_server: WorkflowEnvironment, task_queue: str
) -> None:
    runner = DeliveredEventsRunner(SandboxedWorkflowRunner())
    for timer in TIMERS:
        handle, got = await one_round(dev_server, task_queue, runner, timer)
        assert await replay_failure(handle) is None
        if query_ran_on_undelivered_events(got):
            assert isinstance(got, WorkflowQueryFailedError)
            return
    raise AssertionError(f"the query never waited for a worker over the timer: {got}")


async def test_without_the_guard_the_same_scenario_records_a_history_that_does_not_replay(
    dev_server: WorkflowEnvironment, task_queue: str
) -> None:
    # The negative control: the scenario above, on the SDK's own runner.
    for timer in TIMERS:
        handle, got = await one_round(dev_server, task_queue, SandboxedWorkflowRunner(), timer)
        if query_ran_on_undelivered_events(got):
            failure = await replay_failure(handle)
            assert failure is not None
            assert "Update machine does not handle this event" in failure
            return
    raise AssertionError(f"the query never waited for a worker over the timer: {got}")
