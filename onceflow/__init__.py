"""onceflow: durable, retry-safe execution of side-effecting AI-agent tool calls on Temporal.

The face of the server distribution: what a tool author and an embedding program need.
Names load on first use, so importing ``onceflow`` (which every submodule, workflows
included, does first) costs nothing::

    from onceflow import Tool, ToolCall, ToolContract, DedupeStrategy, EffectFlags

The subpackages hold the rest: ``onceflow.tools`` (the whole tool API),
``onceflow.workflows``, ``onceflow.retry_policy``, ``onceflow.gateway``, ``onceflow.worker``.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onceflow.configuration import OnceflowConfiguration, load_configuration
    from onceflow.errors import OnceflowError
    from onceflow.retry_policy import OutcomeClass, RetryBudget
    from onceflow.tools import (
        ApprovalThreshold,
        ChildOperation,
        DedupeStrategy,
        EffectFlags,
        Lease,
        LeaseLost,
        NothingSent,
        Tool,
        ToolAttemptResult,
        ToolCall,
        ToolContract,
        ToolRegistrationError,
        classify_database_error,
        classify_http_error,
        classify_http_status,
    )

__version__ = "0.6.0"

_HOMES = {
    "OnceflowConfiguration": "onceflow.configuration",
    "load_configuration": "onceflow.configuration",
    "OnceflowError": "onceflow.errors",
    "OutcomeClass": "onceflow.retry_policy",
    "RetryBudget": "onceflow.retry_policy",
    **{
        name: "onceflow.tools"
        for name in (
            "ApprovalThreshold",
            "ChildOperation",
            "DedupeStrategy",
            "EffectFlags",
            "Lease",
            "LeaseLost",
            "NothingSent",
            "Tool",
            "ToolAttemptResult",
            "ToolCall",
            "ToolContract",
            "ToolRegistrationError",
            "classify_database_error",
            "classify_http_error",
            "classify_http_status",
        )
    },
}

__all__ = [
    "ApprovalThreshold",
    "ChildOperation",
    "DedupeStrategy",
    "EffectFlags",
    "Lease",
    "LeaseLost",
    "NothingSent",
    "OnceflowConfiguration",
    "OnceflowError",
    "OutcomeClass",
    "RetryBudget",
    "Tool",
    "ToolAttemptResult",
    "ToolCall",
    "ToolContract",
    "ToolRegistrationError",
    "__version__",
    "classify_database_error",
    "classify_http_error",
    "classify_http_status",
    "load_configuration",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'onceflow' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
