"""The agent-facing boundary: API keys, fingerprints, and claims on the idempotency records
(``onceflow.idempotency``) in PostgreSQL.

Every transport (``gateway.http_api``, ``gateway.mcp_server``) calls the same
``BoundaryService``; it decides what a repeated request means before anything reaches
Temporal, whose ``USE_EXISTING`` dedupes starts but never compares inputs.
"""

from onceflow.errors import (
    KEY_REUSED_DETAIL,
    BackendUnavailable,
    DecisionConflict,
    DecisionRefused,
    DecisionsNotAllowed,
    InvalidRequest,
    KeyReusedWithDifferentRequest,
    MalformedIdempotencyKey,
    MissingIdempotencyKey,
    OriginNotAllowed,
    PayloadNotDecodable,
    QuotaExceeded,
    RequestInProgress,
    RequestTooLarge,
    TaskNotFound,
    ToolNotAllowed,
    Unauthenticated,
    UnknownToolRequested,
)
from onceflow.gateway._fingerprint import API_VERSION, request_fingerprint
from onceflow.gateway._principals import ALL_TOOLS, Principal, PrincipalExists, PrincipalStore
from onceflow.gateway._pruning import ensure_prune_schedule, prune_schedule_id
from onceflow.gateway._requests import (
    ApproveRequest,
    BoundaryAnswer,
    CreateTaskRequest,
    ReconcileRequest,
    TaskStepRequest,
)
from onceflow.gateway._runtime import open_boundary
from onceflow.gateway._service import BoundaryService
from onceflow.gateway._settings import (
    GatewaySettings,
    InvalidGatewaySettings,
    RetentionTooShort,
    check_retention,
    load_gateway_settings,
)
from onceflow.gateway._task_starts import TOOL_CALL_STEP_ID

__all__ = [
    "KEY_REUSED_DETAIL",
    "TOOL_CALL_STEP_ID",
    "ALL_TOOLS",
    "API_VERSION",
    "ApproveRequest",
    "BackendUnavailable",
    "BoundaryAnswer",
    "BoundaryService",
    "CreateTaskRequest",
    "DecisionConflict",
    "DecisionRefused",
    "DecisionsNotAllowed",
    "GatewaySettings",
    "InvalidGatewaySettings",
    "InvalidRequest",
    "KeyReusedWithDifferentRequest",
    "MalformedIdempotencyKey",
    "MissingIdempotencyKey",
    "OriginNotAllowed",
    "PayloadNotDecodable",
    "Principal",
    "PrincipalExists",
    "PrincipalStore",
    "QuotaExceeded",
    "ReconcileRequest",
    "RequestInProgress",
    "RequestTooLarge",
    "RetentionTooShort",
    "TaskNotFound",
    "TaskStepRequest",
    "ToolNotAllowed",
    "Unauthenticated",
    "UnknownToolRequested",
    "check_retention",
    "ensure_prune_schedule",
    "load_gateway_settings",
    "open_boundary",
    "prune_schedule_id",
    "request_fingerprint",
]
