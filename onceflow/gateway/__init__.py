"""The agent-facing boundary: API keys, fingerprints and idempotency records in PostgreSQL.

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
from onceflow.gateway._records import (
    AlreadyClaimed,
    Claimed,
    IdempotencyRecord,
    IdempotencyStore,
    NewClaim,
    PruneResult,
    RecordState,
    Unrecorded,
)
from onceflow.gateway._requests import (
    ApproveRequest,
    BoundaryAnswer,
    CreateTaskRequest,
    ReconcileRequest,
    TaskStepRequest,
)
from onceflow.gateway._responses import (
    StepView,
    TaskView,
    stored_outcome,
    task_status_url,
    task_view,
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
from onceflow.workflows.task_models import REQUEST_HASH_MEMO

__all__ = [
    "KEY_REUSED_DETAIL",
    "REQUEST_HASH_MEMO",
    "TOOL_CALL_STEP_ID",
    "ALL_TOOLS",
    "API_VERSION",
    "AlreadyClaimed",
    "ApproveRequest",
    "BackendUnavailable",
    "BoundaryAnswer",
    "BoundaryService",
    "Claimed",
    "CreateTaskRequest",
    "DecisionConflict",
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
    "OriginNotAllowed",
    "PayloadNotDecodable",
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
    "Unrecorded",
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
