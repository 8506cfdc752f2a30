"""The workflow runner wrapper that keeps no task's state built from events no workflow
task delivered.

A query sent while a task waits on an activity and no workflow task is pending goes straight
to the worker that cached the task. When that worker is dead, the query waits out the sticky
timeout and then goes to any worker, carrying the task's whole history, including events that
arrived meanwhile (an activity that timed out, a timer that fired) and that no workflow task
has delivered yet. Core runs the workflow on those events to answer the query and keeps the
result: the commands they produced are sent with the next workflow task, after an Update
accepted in it, while a replay delivers those events and the Update together and accepts the
Update first. The history then fails every replay (``[TMPRL1100] Update machine does not
handle this event: ActivityTaskScheduled``) and the task is stuck for good.

`DeliveredEventsRunner` notices the activation Core builds from such events and fails the
query that follows it: Core then drops the run from its cache with what it computed, the
query fails (the caller asks again), and the next workflow task replays the task from its
history, in replay's order. The reproduction is
``tests/workflows/test_replay_exact.py::test_a_query_on_a_dead_workers_task_leaves_no_undelivered_state``.
"""

from __future__ import annotations

from typing import Any

import temporalio.workflow
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker import (
    WorkflowInstance,
    WorkflowInstanceDetails,
    WorkflowRunner,
)

LEGACY_QUERY_ID = "legacy_query"
"""The id Core gives a query that came as a task of its own, with the whole history."""

UNDELIVERED_EVENTS_REFUSAL = (
    "the task has events no workflow task has delivered yet (its last worker stopped); "
    "its next workflow task answers for them, ask again"
)


class DeliveredEventsRunner(WorkflowRunner):
    """Wraps a runner so that state built from undelivered events never outlives a query.

    Args:
        inner: The runner that runs the workflows (the sandbox).
    """

    def __init__(self, inner: WorkflowRunner) -> None:
        self._inner = inner

    def prepare_workflow(self, defn: temporalio.workflow._Definition) -> None:
        self._inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _DeliveredEventsInstance(self._inner.create_instance(det))

    def set_worker_level_failure_exception_types(self, types: Any) -> None:
        self._inner.set_worker_level_failure_exception_types(types)


class _DeliveredEventsInstance(WorkflowInstance):
    def __init__(self, inner: WorkflowInstance) -> None:
        self._inner = inner
        self._last: tuple[int, int] | None = None
        """The last non-query activation's (time, history length)."""
        self._undelivered_at: int | None = None
        """The history length of the last activation made of undelivered events."""

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        if act.jobs and all(job.HasField("query_workflow") for job in act.jobs):
            if act.history_length == self._undelivered_at and any(
                job.query_workflow.query_id == LEGACY_QUERY_ID for job in act.jobs
            ):
                # Failing this activation is what makes Core evict the run (a failed
                # legacy query is reported as the query's failure, not the task's).
                refused = WorkflowActivationCompletion(run_id=act.run_id)
                refused.failed.failure.message = UNDELIVERED_EVENTS_REFUSAL
                return refused
            return self._inner.activate(act)
        # A workflow task's activations carry the time of its WorkflowTaskStarted event;
        # events applied past the last such event keep the previous time. The query that
        # carried them comes next, from the same history (the same length); a query after
        # a workflow task that completed carries at least its WorkflowTaskCompleted event.
        stamp = (act.timestamp.ToNanoseconds(), act.history_length)
        last, self._last = self._last, stamp
        undelivered = last is not None and stamp[0] == last[0] and stamp[1] > last[1]
        self._undelivered_at = act.history_length if undelivered else None
        return self._inner.activate(act)

    def get_serialization_context(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.get_serialization_context(*args, **kwargs)

    def get_external_store_context(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.get_external_store_context(*args, **kwargs)

    def get_info(self) -> temporalio.workflow.Info:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()
