"""Client-side access to tasks: the Temporal connection and ``TaskClient``."""

from onceflow.errors import CallRefused, DecisionConflict, DecisionRefused
from onceflow.task_api._connection import connect_temporal
from onceflow.task_api._tasks import (
    DecisionAnswer,
    SentCall,
    TaskClient,
    TaskSummary,
    settle_decision,
)

__all__ = [
    "CallRefused",
    "DecisionAnswer",
    "DecisionConflict",
    "DecisionRefused",
    "SentCall",
    "TaskClient",
    "TaskSummary",
    "connect_temporal",
    "settle_decision",
]
