"""Client-side access to tasks: the Temporal connection and ``TaskClient``."""

from onceflow.task_api._connection import connect_temporal
from onceflow.task_api._tasks import DecisionRefused, TaskClient, TaskSummary

__all__ = ["DecisionRefused", "TaskClient", "TaskSummary", "connect_temporal"]
