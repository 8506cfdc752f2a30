"""The tool API's side for the processes that serve tools, not for a tool author: the
catalogue and its registration (``CATALOGUE``, ``register_tools``, ``load_configured_tools``,
the families a process has loaded), the activities a worker runs for the tools, the
policy pinned from a contract, the audit activities, the identities derived for keys and
tasks, and the client checks a worker makes when it opens a tool's client.

The worker, the gateway, the CLI and the workflow import these; a tool author builds on
``onceflow.tools`` and needs nothing from here (as with ``onceflow.tools.providers``).
Loading reads no process settings: a family function that takes an argument is given
the settings source its entry point passes."""

from onceflow.errors import MalformedIdempotencyKey
from onceflow.tools._activities import tool_activities
from onceflow.tools._attempts import KeyUnusable, ToolCallInput
from onceflow.tools._audit_runs import (
    RUN_AUDIT,
    AuditActivities,
    AuditActivityInput,
    AuditRunInput,
    AuditRunResult,
)
from onceflow.tools._catalogue import CATALOGUE, Catalogue, UnknownTool
from onceflow.tools._child_operation import FIRST_SENT_AT, KEY_GENERATION
from onceflow.tools._classify import KeyWindowClosed
from onceflow.tools._client_retries import (
    client_retry_problems,
    open_tool_client,
    refuse_retrying_client,
)
from onceflow.tools._family import loaded_families
from onceflow.tools._identity import (
    IDEMPOTENCY_KEY_MAX_LENGTH,
    IDEMPOTENCY_KEY_PATTERN,
    arguments_digest,
    check_idempotency_key,
    derive_child_key,
    derive_task_workflow_id,
    key_digest,
)
from onceflow.tools._intent_claims import prune_intents
from onceflow.tools._loading import (
    ENTRY_POINT_GROUP,
    load_configured_tools,
    load_families,
    load_tools,
    register_tools,
)
from onceflow.tools._pinning import PolicyPinning
from onceflow.tools._policy import PIN_TASK_POLICY, PinPolicyInput, TaskPolicy, ToolPolicy
from onceflow.tools._tool import lookup_activity_name

__all__ = [
    "CATALOGUE",
    "ENTRY_POINT_GROUP",
    "FIRST_SENT_AT",
    "IDEMPOTENCY_KEY_MAX_LENGTH",
    "IDEMPOTENCY_KEY_PATTERN",
    "KEY_GENERATION",
    "PIN_TASK_POLICY",
    "RUN_AUDIT",
    "AuditActivities",
    "AuditActivityInput",
    "AuditRunInput",
    "AuditRunResult",
    "Catalogue",
    "KeyUnusable",
    "KeyWindowClosed",
    "MalformedIdempotencyKey",
    "PinPolicyInput",
    "PolicyPinning",
    "TaskPolicy",
    "ToolCallInput",
    "ToolPolicy",
    "UnknownTool",
    "arguments_digest",
    "check_idempotency_key",
    "client_retry_problems",
    "derive_child_key",
    "derive_task_workflow_id",
    "key_digest",
    "load_configured_tools",
    "load_families",
    "load_tools",
    "loaded_families",
    "lookup_activity_name",
    "open_tool_client",
    "prune_intents",
    "refuse_retrying_client",
    "register_tools",
    "tool_activities",
]
