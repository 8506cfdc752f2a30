"""The one retry owner's policy: outcome classes and the workflow-wide retry budget.

Pure code: no I/O, no clock, no randomness except an injected RNG, so a workflow can
call it and replay to the same decisions.
"""

from onceflow.retry_policy._budget import RetryBudget, StepUsage
from onceflow.retry_policy._decisions import (
    Decision,
    FailStep,
    ParkStep,
    RetryStep,
    decide_after_attempt,
)
from onceflow.retry_policy._outcomes import OutcomeClass

__all__ = [
    "Decision",
    "FailStep",
    "OutcomeClass",
    "ParkStep",
    "RetryBudget",
    "RetryStep",
    "StepUsage",
    "decide_after_attempt",
]
