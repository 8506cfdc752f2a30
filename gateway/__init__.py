"""The agent-facing boundary: API keys, fingerprints and idempotency records in PostgreSQL.

Every transport (``gateway.http_api``, ``gateway.mcp_server``) calls the same
``BoundaryService``; it decides what a repeated request means before anything reaches
Temporal, whose ``USE_EXISTING`` dedupes starts but never compares inputs.
"""

from gateway._errors import (
    BackendUnavailable,
    BoundaryError,
    DecisionRefused,
    DecisionsNotAllowed,
    InvalidRequest,
    KeyReusedWithDifferentRequest,
    MalformedIdempotencyKey,
    MissingIdempotencyKey,
    QuotaExceeded,
    RequestInProgress,
    RequestTooLarge,
    TaskNotFound,
    ToolNotAllowed,
    Unauthenticated,
    UnknownToolRequested,
)
from gateway._fingerprint import API_VERSION, request_fingerprint
from gateway._principals import ALL_TOOLS, Principal, PrincipalExists, PrincipalStore
from gateway._pruning import ensure_prune_schedule, prune_schedule_id
from gateway._records import (
    AlreadyClaimed,
    Claimed,
    IdempotencyRecord,
    IdempotencyStore,
    NewClaim,
    PruneResult,
    RecordState,
)
from gateway._responses import StepView, TaskView, stored_outcome, task_status_url, task_view
from gateway._runtime import open_boundary
from gateway._service import (
    ApproveRequest,
    BoundaryAnswer,
    BoundaryService,
    CreateTaskRequest,
    ReconcileRequest,
    TaskStepRequest,
)
from gateway._settings import (
    GatewaySettings,
    InvalidGatewaySettings,
    RetentionTooShort,
    check_retention,
    load_gateway_settings,
)

__all__ = [
    "ALL_TOOLS",
    "API_VERSION",
    "AlreadyClaimed",
    "ApproveRequest",
    "BackendUnavailable",
    "BoundaryAnswer",
    "BoundaryError",
    "BoundaryService",
    "Claimed",
    "CreateTaskRequest",
    "DecisionRefused",
    "DecisionsNotAllowed",
    "GatewaySettings",
    "IdempotencyRecord",
    "IdempotencyStore",
    "InvalidGatewaySettings",
    "InvalidRequest",
    "KeyReusedWithDifferentRequest",
    "MalformedIdempotencyKey",
    "MissingIdempotencyKey",
    "NewClaim",
    "Principal",
    "PrincipalExists",
    "PrincipalStore",
    "PruneResult",
    "QuotaExceeded",
    "ReconcileRequest",
    "RecordState",
    "RequestInProgress",
    "RequestTooLarge",
    "RetentionTooShort",
    "StepView",
    "TaskNotFound",
    "TaskStepRequest",
    "TaskView",
    "ToolNotAllowed",
    "Unauthenticated",
    "UnknownToolRequested",
    "check_retention",
    "ensure_prune_schedule",
    "load_gateway_settings",
    "open_boundary",
    "prune_schedule_id",
    "request_fingerprint",
    "stored_outcome",
    "task_status_url",
    "task_view",
]
