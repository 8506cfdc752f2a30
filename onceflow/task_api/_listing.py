"""A task's state as the listings read it from Temporal's visibility store.

A task publishes its state (``OnceflowState``) while it runs. Since 0.6.0 one that ends as
it ran (a plan succeeded, an open task closed) publishes no final state: its close status,
Completed, says it (``AgentTaskInput.ends_by_close_status``); a failed plan still publishes
``failed``. Tasks of earlier releases published every end, so each filter below also
matches the published end.
"""

from temporalio.client import WorkflowExecutionStatus

from onceflow.workflows.task_models import TaskState
from onceflow.workflows.visibility import TASK_KIND, TASK_STATE

_STATE = TASK_STATE.name
_KIND = TASK_KIND.name
_ENDS = frozenset(state.value for state in TaskState if state.is_terminal)


def state_filter(state: TaskState) -> str:
    """The visibility query clause for tasks in ``state``."""
    if state is TaskState.SUCCEEDED:
        return (
            f"ExecutionStatus = 'Completed' AND ({_STATE} = 'succeeded' "
            f"OR ({_KIND} = 'plan' AND {_STATE} = 'running'))"
        )
    if state is TaskState.CLOSED:
        return f"ExecutionStatus = 'Completed' AND ({_STATE} = 'closed' OR {_KIND} = 'open')"
    if state is TaskState.FAILED:
        return f"{_STATE} = 'failed'"
    # A task stopped from outside (terminated, timed out) keeps what it last published.
    return f"ExecutionStatus = 'Running' AND {_STATE} = '{state.value}'"


def listed_state(published: str | None, kind: str, status: WorkflowExecutionStatus | None) -> str:
    """The state a listing shows: the published one while the task runs or once it
    published its end; else its close status says it (a plan that completed succeeded, an
    open task that completed closed; terminated, timed out and the like by their name)."""
    if published is not None and published in _ENDS:
        return published
    if status is WorkflowExecutionStatus.COMPLETED:
        return TaskState.CLOSED.value if kind == "open" else TaskState.SUCCEEDED.value
    if status is not None and status is not WorkflowExecutionStatus.RUNNING:
        return status.name.lower()
    return published or "unknown"
