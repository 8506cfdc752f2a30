"""One Temporal plugin for every client, worker and replayer, and the workflow runner it
brings.

``OnceflowPlugin`` carries what they must agree on: the data converter, the interceptors,
the workflow runner, the workflows and a worker's activities. The runner is the sandbox
wrapped twice, one job each: ``DeliveredEventsRunner`` keeps no task's state built from
events no workflow task delivered; ``ContextFreeRunner`` answers the SDK's payload-context
questions without entering the sandbox. Neither is workflow code, so neither lives in the
deterministic ``onceflow.workflows``.
"""

from onceflow.plugin._payload_contexts import ContextFreeRunner, converter_uses_context
from onceflow.plugin._plugin import (
    PASS_THROUGH_SANDBOX,
    STRICT_SANDBOX,
    TASK_WORKFLOWS,
    OnceflowPlugin,
    workflow_runner,
)
from onceflow.plugin._undelivered_events import (
    LEGACY_QUERY_ID,
    UNDELIVERED_EVENTS_REFUSAL,
    DeliveredEventsRunner,
)

__all__ = [
    "LEGACY_QUERY_ID",
    "PASS_THROUGH_SANDBOX",
    "STRICT_SANDBOX",
    "TASK_WORKFLOWS",
    "UNDELIVERED_EVENTS_REFUSAL",
    "ContextFreeRunner",
    "DeliveredEventsRunner",
    "OnceflowPlugin",
    "converter_uses_context",
    "workflow_runner",
]
