"""Every way the boundary refuses or defers a request, one exception class each.

The classes carry their HTTP status and problem type, so they are translated once, at
the edge (``gateway.http_api`` into ``application/problem+json``, ``gateway.mcp_server``
into MCP tool errors). No message ever repeats a raw idempotency key or a request body::

    BoundaryError
    ├── Unauthenticated                  401  no or unknown API key
    ├── ToolNotAllowed                   403  the principal may not call this tool
    ├── DecisionsNotAllowed              403  the principal may not approve or reconcile
    ├── OriginNotAllowed                 403  a browser request from another site than the UI's
    ├── UnknownToolRequested             404  no tool of that name
    ├── TaskNotFound                     404  no such task for this tenant
    ├── MissingIdempotencyKey            400  a mutating call without a key
    ├── MalformedIdempotencyKey          400  too long, outside the key alphabet, or repeated
    ├── InvalidRequest                   400  the body does not validate (nothing reserved)
    ├── RequestTooLarge                  413  the body is larger than the gateway reads
    ├── UnsupportedMediaType             415  a body that is not sent as JSON
    ├── KeyReusedWithDifferentRequest    422  same key, different fingerprint
    ├── PayloadNotDecodable              422  the codec endpoint cannot decrypt a payload
    ├── RequestInProgress                409  another request holds the key's claim
    ├── DecisionRefused                  409  the task refused an approve/reconcile
    ├── DecisionConflict                 409  the step was decided otherwise, or the task ended
    ├── CallRefused                      409  an open task refused a call (closed, budget spent…)
    ├── TaskNotOpen                      409  a call or close aimed at a plan, not an open task
    ├── QuotaExceeded                    429  too many new keys in this window
    └── BackendUnavailable               503  Temporal or PostgreSQL could not be reached
        └── NotReady                     503  readiness: PostgreSQL or Temporal is down

Every error that asks for a later retry (409 ``request-in-progress``, 429, every 503)
carries ``retry_after_seconds``, sent as ``Retry-After``.

A decision or call refusal stored in a key's record comes back from ``replayed_problem``
as the same class and document, flagged ``replayed``.
"""

from collections.abc import Mapping
from typing import Any, ClassVar

PROBLEM_BASE = "urn:onceflow:problem:"
KEY_REUSED_DETAIL = (
    "this Idempotency-Key was already used for a different request; use a new key for a new request"
)
"""The one wording of a key reused for another request (HTTP 422, MCP, CLI exit 2)."""


class BoundaryError(Exception):
    """A request the boundary answers with an error instead of a task result."""

    status: ClassVar[int] = 500
    slug: ClassVar[str] = "internal"
    title: ClassVar[str] = "Internal error"
    replayed: bool = False
    """Whether this is the stored answer of an earlier request with the same key (sent
    with ``Idempotent-Replayed: true``), not a refusal made now."""
    retry_after_seconds: int | None = None
    """Seconds after which a retry may succeed (``Retry-After``); None for a refusal that
    a retry of the same request cannot change."""

    def __init__(self, detail: str, **extensions: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extensions = extensions

    @property
    def problem_type(self) -> str:
        """The RFC 9457 ``type`` URI of this failure mode."""
        return PROBLEM_BASE + self.slug

    def problem(self) -> dict[str, Any]:
        """The RFC 9457 problem document (``application/problem+json``)."""
        return {
            "type": self.problem_type,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            **self.extensions,
        }


class Unauthenticated(BoundaryError):
    """No API key, or one that matches no active principal."""

    status = 401
    slug = "unauthenticated"
    title = "Authentication required"


class ToolNotAllowed(BoundaryError):
    """The authenticated principal may not call this tool."""

    status = 403
    slug = "tool-not-allowed"
    title = "Tool not allowed for this principal"


class DecisionsNotAllowed(BoundaryError):
    """The authenticated principal may not approve or reconcile tasks."""

    status = 403
    slug = "decisions-not-allowed"
    title = "Operator decisions not allowed for this principal"


class OriginNotAllowed(BoundaryError):
    """A browser request to the codec endpoint from an origin other than the Temporal UI's."""

    status = 403
    slug = "origin-not-allowed"
    title = "Origin not allowed"


class PayloadNotDecodable(BoundaryError):
    """The codec endpoint holds no key for a payload, or the payload does not authenticate."""

    status = 422
    slug = "payload-not-decodable"
    title = "Payload cannot be decrypted"


class UnknownToolRequested(BoundaryError):
    """No tool of that name is in the catalogue."""

    status = 404
    slug = "unknown-tool"
    title = "Unknown tool"


class TaskNotFound(BoundaryError):
    """No task with that id exists for the principal's tenant."""

    status = 404
    slug = "task-not-found"
    title = "Task not found"


class MissingIdempotencyKey(BoundaryError):
    """A call that creates an effect arrived without an idempotency key."""

    status = 400
    slug = "idempotency-key-missing"
    title = "Idempotency-Key required"


class MalformedIdempotencyKey(BoundaryError):
    """The key is too long, outside its alphabet, or not one key (a repeat, a list)."""

    status = 400
    slug = "idempotency-key-malformed"
    title = "Malformed Idempotency-Key"


class InvalidRequest(BoundaryError):
    """The body (or a path or query value) failed validation; nothing was reserved."""

    status = 400
    slug = "invalid-request"
    title = "Invalid request"


class RequestTooLarge(BoundaryError):
    """The request body is larger than the gateway reads; nothing was reserved."""

    status = 413
    slug = "request-too-large"
    title = "Request body too large"


class UnsupportedMediaType(BoundaryError):
    """A body sent with a ``Content-Type`` other than JSON, or none; nothing was reserved."""

    status = 415
    slug = "unsupported-media-type"
    title = "Unsupported media type"


class KeyReusedWithDifferentRequest(BoundaryError):
    """The key was already used in this scope for a request with another fingerprint."""

    status = 422
    slug = "idempotency-key-reused"
    title = "Idempotency-Key reused with a different request"


class RequestInProgress(BoundaryError):
    """Another request holds this key's claim and has not started the task yet."""

    status = 409
    slug = "request-in-progress"
    title = "A request with this Idempotency-Key is in progress"

    def __init__(self, detail: str, *, retry_after_seconds: int, **extensions: Any) -> None:
        super().__init__(detail, **extensions)
        self.retry_after_seconds = retry_after_seconds


class DecisionRefused(BoundaryError):
    """The task refused an approve or reconcile decision; nothing was recorded."""

    status = 409
    slug = "decision-refused"
    title = "Decision refused by the task"


class DecisionConflict(BoundaryError):
    """The step was decided otherwise, or the task has ended; nothing was recorded."""

    # The problem document carries task_state, step_state and, when there is one, the
    # step's earlier accepted decision.

    status = 409
    slug = "decision-conflict"
    title = "The task is past this decision"


class CallRefused(BoundaryError):
    """An open task refused a call before anything was recorded; ``reason`` says why."""

    # The task's own words are the detail and ``reason``: the task is closed or closing,
    # its budget or deadline is spent, or the call id names another call.

    status = 409
    slug = "call-refused"
    title = "Call refused by the task"


class TaskNotOpen(BoundaryError):
    """A call or close aimed at a plan, whose steps were all given when it started."""

    status = 409
    slug = "task-not-open"
    title = "The task is a plan, not an open task"


class QuotaExceeded(BoundaryError):
    """The principal created more new idempotency keys than its quota allows."""

    status = 429
    slug = "key-quota-exceeded"
    title = "Idempotency-key quota exceeded"

    def __init__(self, detail: str, *, retry_after_seconds: int, **extensions: Any) -> None:
        super().__init__(detail, **extensions)
        self.retry_after_seconds = retry_after_seconds


class BackendUnavailable(BoundaryError):
    """Temporal or PostgreSQL could not be reached; a retry with the same key is safe."""

    status = 503
    slug = "backend-unavailable"
    title = "Service temporarily unavailable"

    def __init__(self, detail: str, *, retry_after_seconds: int = 2, **extensions: Any) -> None:
        super().__init__(detail, **extensions)
        self.retry_after_seconds = retry_after_seconds


class TaskUnanswered(BackendUnavailable):
    """The task exists but did not answer (no worker took its query in time, or its
    workflow task fails); ``detail`` says which, from what Temporal holds without a
    worker. Reading again after ``Retry-After`` is safe."""

    slug = "task-unanswered"
    title = "Task did not answer"


class TaskBusy(BackendUnavailable):
    """The task is taking as many calls and decisions at once as Temporal allows (ten
    Updates in flight per workflow); nothing reached it, and a retry with the same key
    after ``Retry-After`` is safe. Both backends are up: not a 503."""

    status = 429
    slug = "task-busy"
    title = "Task busy"

    def __init__(self, detail: str, *, retry_after_seconds: int = 1, **extensions: Any) -> None:
        super().__init__(detail, retry_after_seconds=retry_after_seconds, **extensions)


class NotReady(BackendUnavailable):
    """``GET /readyz``: PostgreSQL or Temporal does not answer; ``checks`` says which."""

    slug = "not-ready"
    title = "Not ready"


def replayed_problem(problem: Mapping[str, Any]) -> BoundaryError:
    """The refusal a stored problem document records, flagged ``replayed``.

    A keyed decision or call the task refused keeps that refusal as its result, so every
    retry with the key gets the same document back, as a replay.

    Raises:
        ValueError: The document is not one of the refusals a record can hold.
    """
    slug = str(problem.get("type", "")).removeprefix(PROBLEM_BASE)
    kinds = {kind.slug: kind for kind in _STORED_REFUSALS}
    if slug not in kinds:
        raise ValueError(f"a record holds no refusal of type {slug!r}")
    extensions = {
        name: value
        for name, value in problem.items()
        if name not in ("type", "title", "status", "detail")
    }
    error = kinds[slug](str(problem.get("detail", "")), **extensions)
    error.replayed = True
    return error


_STORED_REFUSALS: tuple[type[BoundaryError], ...] = (DecisionRefused, DecisionConflict, CallRefused)
"""The refusals an idempotency record keeps as its result: the task's own answers."""
