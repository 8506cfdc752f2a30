"""The public names of each distribution, pinned (as sdk-python's test_client_exports does).

A name added or removed here is an API change: change the list on purpose, with the docs.
"""

import importlib

import onceflow_client

import onceflow

ONCEFLOW = [
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
TOOLS = [
    "ApprovalThreshold",
    "AuditFinding",
    "AuditProgress",
    "AuditReport",
    "AuditWindow",
    "Auditor",
    "ChildOperation",
    "ClientOpener",
    "ClientRetryCheck",
    "DEFAULT_HEARTBEAT_EVERY",
    "DEFAULT_LEASE_TTL",
    "DatabaseUnavailable",
    "DedupeStrategy",
    "EffectFlags",
    "EffectTotal",
    "FindingKind",
    "Implementation",
    "IntentIdentity",
    "Lease",
    "LeaseLost",
    "LocalWrite",
    "NothingSent",
    "OperationRecord",
    "OutcomeClass",
    "Provider",
    "ProviderUnreadable",
    "Redaction",
    "StartupProblem",
    "Tool",
    "ToolAttemptResult",
    "ToolCall",
    "ToolContract",
    "ToolFamily",
    "ToolRegistrationError",
    "autocommit",
    "classify_database_error",
    "classify_http_error",
    "classify_http_status",
    "read_operations",
    "read_step_operations",
]
"""The tool author's API (docs/tool-api.md documents exactly these)."""
TOOLS_WORKER = [
    "AuditActivities",
    "AuditActivityInput",
    "AuditRunInput",
    "AuditRunResult",
    "CATALOGUE",
    "Catalogue",
    "ENTRY_POINT_GROUP",
    "FIRST_SENT_AT",
    "IDEMPOTENCY_KEY_MAX_LENGTH",
    "IDEMPOTENCY_KEY_PATTERN",
    "KEY_GENERATION",
    "KeyUnusable",
    "KeyWindowClosed",
    "MalformedIdempotencyKey",
    "PIN_TASK_POLICY",
    "PinPolicyInput",
    "PolicyPinning",
    "RUN_AUDIT",
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
"""What the processes serving tools use (``onceflow.tools.worker``), not a tool author."""
CLIENT = [
    "BackendUnavailable",
    "BadRequest",
    "CallRefused",
    "CallResult",
    "Conflict",
    "DecisionConflict",
    "IdempotencyKeyReused",
    "InvalidIdempotencyKey",
    "NotFound",
    "OnceflowClient",
    "OnceflowError",
    "OpenTask",
    "PermissionDenied",
    "RateLimited",
    "RequestInProgress",
    "TaskResult",
    "Unauthenticated",
    "new_idempotency_key",
]


def test_onceflow_exports_its_curated_names_and_each_resolves() -> None:
    assert sorted(onceflow.__all__) == sorted(ONCEFLOW)
    for name in ONCEFLOW:
        assert getattr(onceflow, name) is not None, name


def test_onceflow_names_are_the_ones_their_subpackages_define() -> None:
    tools = importlib.import_module("onceflow.tools")
    assert onceflow.Tool is tools.Tool
    assert onceflow.OutcomeClass is importlib.import_module("onceflow.retry_policy").OutcomeClass
    assert set(ONCEFLOW) - {"__version__"} <= {
        *tools.__all__,
        "OnceflowConfiguration",
        "OnceflowError",
        "load_configuration",
        "OutcomeClass",
        "RetryBudget",
    }


def test_the_tool_api_exports_its_curated_names() -> None:
    tools = importlib.import_module("onceflow.tools")
    assert sorted(tools.__all__) == TOOLS
    for name in TOOLS:
        assert getattr(tools, name) is not None, name


def test_the_tool_plumbing_is_its_own_module_apart_from_the_authors_api() -> None:
    worker = importlib.import_module("onceflow.tools.worker")
    assert sorted(worker.__all__) == TOOLS_WORKER
    for name in TOOLS_WORKER:
        assert getattr(worker, name) is not None, name
    assert set(TOOLS).isdisjoint(TOOLS_WORKER)


def test_the_client_exports_its_curated_names() -> None:
    assert sorted(onceflow_client.__all__) == sorted(CLIENT)
    for name in CLIENT:
        assert getattr(onceflow_client, name) is not None, name
