"""Proving that something did not happen: probes that show the system went quiet.

A negative check ("nothing was resent", "no second workflow", "no secret was exported")
is only as good as the moment it looks. Each probe here waits for evidence that
everything that could still happen has happened, instead of a pause:

* ``workflow_idle``: the workflow has nothing of its own pending (no workflow task,
  activity, timer, child or Nexus operation) and every activity it started has reported
  back, so until someone outside acts it can cause nothing more.
* ``settled_count``: Temporal's visibility store (eventually consistent) has indexed a
  marker workflow started after the fact, so it has indexed everything before it too.
* ``passed_marker``: a marker sent down ordered channels (a span exporter's queue, a log
  stream, an outbox read in arming order) came out of each end, so whatever entered
  them before the marker has come out too.
"""

import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

from ._eventually import HANG_SECONDS, eventually

M = TypeVar("M")

_REPORTED_BACK = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "activity_task_completed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity_task_failed_event_attributes",
}
"""An activity whose code returned or raised; a timed-out or cancelled one may still run."""
KEY_WINDOW_SUMMARY = b"send window of step"
"""A key's send-window timer: its firing only closes the window (a parked step's key can
no longer be sent); it sends nothing, so it does not keep a workflow from being idle."""


async def workflow_idle(client: Client, workflow_id: str, *, timeout: float = HANG_SECONDS) -> None:
    """Wait until the workflow can cause nothing more by itself.

    Idle: the workflow is closed, or running with no workflow task, activity, timer
    (but a key's send-window timer, which sends nothing), child workflow or Nexus
    operation pending (it waits for a signal, an update or an
    operator); and every activity it scheduled has completed or failed, so no activity
    code is still running with effects to come. A timed-out or cancelled activity is never
    vouched for: its code may still be running, and the probe fails.

    Raises:
        AssertionError: Something was still pending after ``timeout``; names it.
    """
    handle = client.get_workflow_handle(workflow_id)
    await eventually(
        lambda: _pending(handle),
        until=lambda pending: not pending,
        what=f"workflow {workflow_id} has nothing pending of its own",
        timeout=timeout,
    )


async def _pending(handle: WorkflowHandle[Any, Any]) -> list[str]:
    described = await handle.describe()
    raw = described.raw_description
    running = described.status is WorkflowExecutionStatus.RUNNING
    pending: list[str] = []
    if running and raw.HasField("pending_workflow_task"):
        pending.append("a workflow task")
    if running:
        pending += [f"child workflow {child.workflow_id}" for child in raw.pending_children]
        pending += [f"Nexus operation {op.operation}" for op in raw.pending_nexus_operations]
    timers: set[str] = set()
    activities: dict[int, str] = {}
    async for event in handle.fetch_history_events():
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_TIMER_STARTED:
            if not is_key_window_timer(event):
                timers.add(event.timer_started_event_attributes.timer_id)
        elif kind == EventType.EVENT_TYPE_TIMER_FIRED:
            timers.discard(event.timer_fired_event_attributes.timer_id)
        elif kind == EventType.EVENT_TYPE_TIMER_CANCELED:
            timers.discard(event.timer_canceled_event_attributes.timer_id)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled = event.activity_task_scheduled_event_attributes
            activities[event.event_id] = scheduled.activity_type.name
        elif kind in _REPORTED_BACK:
            reported = getattr(event, _REPORTED_BACK[kind])
            activities.pop(reported.scheduled_event_id, None)
    if running:
        pending += [f"timer {timer}" for timer in sorted(timers)]
    pending += [f"activity {name} (not reported back)" for name in activities.values()]
    return pending


def is_key_window_timer(event: HistoryEvent) -> bool:
    """Whether a ``TimerStarted`` event starts a key's send-window timer."""
    return KEY_WINDOW_SUMMARY in event.user_metadata.summary.data


async def key_window_closed(
    client: Client, workflow_id: str, *, timeout: float = HANG_SECONDS
) -> None:
    """Wait until the workflow's key window timer fired: from then on the workflow holds
    the step's key unusable (its decisions read the timer, not a clock)."""
    handle = client.get_workflow_handle(workflow_id)

    async def fired() -> bool:
        windows: set[str] = set()
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_TIMER_STARTED and is_key_window_timer(
                event
            ):
                windows.add(event.timer_started_event_attributes.timer_id)
            elif event.event_type == EventType.EVENT_TYPE_TIMER_FIRED:
                if event.timer_fired_event_attributes.timer_id in windows:
                    return True
        return False

    await eventually(fired, what=f"the key window timer of {workflow_id} fired", timeout=timeout)


async def settled_count(client: Client, query: str, *, timeout: float = HANG_SECONDS) -> int:
    """How many workflows match ``query``, once visibility caught up with what happened.

    Visibility is eventually consistent. A marker workflow (a type no worker runs, on a
    task queue of its own) is started now and the count is read once visibility lists
    the marker. The dev server keeps one history shard whose visibility queue is read in
    the order its tasks were written, so the records of every workflow started before
    the marker were taken up before the marker's was (the assumption this probe rests
    on; a fixed pause rested on a guess). The marker is terminated afterwards. ``query``
    must not match the marker (filter on a workflow type, a search attribute or an id).
    """
    marker = f"visibility-marker-{uuid.uuid4().hex}"
    handle = await client.start_workflow("VisibilityMarker", id=marker, task_queue=marker)
    try:
        await eventually(
            lambda: client.count_workflows(f"WorkflowId = '{marker}'"),
            until=lambda counted: counted.count == 1,
            what=f"visibility lists the marker workflow {marker}",
            timeout=timeout,
        )
        return (await client.count_workflows(query)).count
    finally:
        await handle.terminate("visibility marker, no longer needed")


async def passed_marker(
    send: Callable[[], Awaitable[M]],
    *arrived: Callable[[M], object],
    what: str,
    timeout: float = HANG_SECONDS,
) -> M:
    """Send a marker down ordered channels and wait until it came out of every one.

    Use it when the thing that must not happen would travel a FIFO channel: once the
    marker, sent after the fact, has come out of the channel's far end, everything that
    entered before it has come out too, and a scan of the far end is complete.

    Args:
        send: Sends the marker; returns what identifies it (an id, a key).
        arrived: One check per channel: has the marker come out of its end? Sync or async.
        what: The channels, in words, for the failure message.
        timeout: Seconds to wait for each channel. Default ``HANG_SECONDS``.

    Returns:
        What ``send`` returned.
    """
    marker = await send()
    for check in arrived:
        await eventually(
            lambda check=check: check(marker),  # type: ignore[misc]
            what=f"the marker {marker!r} came out of {what}",
            timeout=timeout,
        )
    return marker
