"""Every error onceflow raises to its users, under one root, ``OnceflowError``.

Each class carries its HTTP status, a stable ``code`` and the RFC 9457 problem type built
from it, so an error is translated once, at the edge (``gateway.http_api`` into
``application/problem+json``, ``gateway.mcp_server`` into MCP tool errors, the CLI into
an exit code). The task API raises the same classes the boundary answers with. No
message ever repeats a raw idempotency key, a secret or a request body::

    OnceflowError                        500  the root; an unexpected failure
    ├── Unauthenticated                  401  no or unknown API key
    ├── ToolNotAllowed                   403  the principal may not call this tool
    ├── DecisionsNotAllowed              403  the principal may not make this decision
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
        ├── TaskUnanswered               503  the task exists but did not answer in time
        ├── TaskBusy                     429  the task takes as many Updates as Temporal allows
        └── NotReady                     503  readiness: PostgreSQL or Temporal is down

Errors of one process rather than one request subclass the root too, with their
Python base kept (``InvalidSettings`` is also a ``ValueError``): ``InvalidSettings``,
``ToolRegistrationError``, ``UnknownTool``, ``PayloadDecryptionFailed``,
``PrincipalExists``, ``RetentionTooShort``, ``ToolNotOnThisWorker`` and the CLI's
``CommandFailed``, each where it is raised.

Every error that asks for a later retry (409 ``request-in-progress``, 429, every 503)
carries ``retry_after_seconds``, sent as ``Retry-After``.

A decision or call refusal stored in a key's record comes back from ``replayed_problem``
as the same class and document, flagged ``replayed``.
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from pydantic import ValidationError

PROBLEM_BASE = "urn:onceflow:problem:"
KEY_REUSED_DETAIL = (
    "this Idempotency-Key was already used for a different request; use a new key for a new request"
)
"""The one wording of a key reused for another request (HTTP 422, MCP, CLI exit 2)."""


class OnceflowError(Exception):
    """The root of every error onceflow raises to its users.

    ``status`` is the HTTP status the boundary answers with, ``code`` a stable name of
    the failure mode (the problem type's last part); ``extensions`` are the problem
    document's extra members.
    """

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal"
    title: ClassVar[str] = "Internal error"
    replayed: bool = False
    """Whether this is the stored answer of an earlier request with the same key (sent
    with ``Idempotent-Replayed: true``), not a refusal made now."""
    retry_after_seconds: int | None = None
    """Seconds after which a retry may succeed (``Retry-After``); None for a refusal that
    a retry of the same request cannot change."""

    def __init__(self, detail: str = "", **extensions: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extensions = extensions

    @property
    def problem_type(self) -> str:
        """The RFC 9457 ``type`` URI of this failure mode."""
        return PROBLEM_BASE + self.code

    def problem(self) -> dict[str, Any]:
        """The RFC 9457 problem document (``application/problem+json``)."""
        return {
            "type": self.problem_type,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            **self.extensions,
        }


class Unauthenticated(OnceflowError):
    """No API key, or one that matches no active principal."""

    status = 401
    code = "unauthenticated"
    title = "Authentication required"


class ToolNotAllowed(OnceflowError):
    """The authenticated principal may not call this tool."""

    status = 403
    code = "tool-not-allowed"
    title = "Tool not allowed for this principal"


class DecisionsNotAllowed(OnceflowError):
    """The authenticated principal may not make this decision (approve, or reconcile)."""

    status = 403
    code = "decisions-not-allowed"
    title = "Operator decisions not allowed for this principal"


class OriginNotAllowed(OnceflowError):
    """A browser request to the codec endpoint from an origin other than the Temporal UI's."""

    status = 403
    code = "origin-not-allowed"
    title = "Origin not allowed"


class PayloadNotDecodable(OnceflowError):
    """The codec endpoint holds no key for a payload, or the payload does not authenticate."""

    status = 422
    code = "payload-not-decodable"
    title = "Payload cannot be decrypted"


class UnknownToolRequested(OnceflowError):
    """No tool of that name is in the catalogue."""

    status = 404
    code = "unknown-tool"
    title = "Unknown tool"


class TaskNotFound(OnceflowError):
    """No task with that id exists for the principal's tenant."""

    status = 404
    code = "task-not-found"
    title = "Task not found"


class MissingIdempotencyKey(OnceflowError):
    """A call that creates an effect arrived without an idempotency key."""

    status = 400
    code = "idempotency-key-missing"
    title = "Idempotency-Key required"


class MalformedIdempotencyKey(OnceflowError, ValueError):
    """The key is empty, too long, outside its alphabet, or not one key (a repeat, a list)."""

    status = 400
    code = "idempotency-key-malformed"
    title = "Malformed Idempotency-Key"


class InvalidRequest(OnceflowError):
    """The body (or a path or query value) failed validation; nothing was reserved."""

    status = 400
    code = "invalid-request"
    title = "Invalid request"


class RequestTooLarge(OnceflowError):
    """The request body is larger than the gateway reads; nothing was reserved."""

    status = 413
    code = "request-too-large"
    title = "Request body too large"


class UnsupportedMediaType(OnceflowError):
    """A body sent with a ``Content-Type`` other than JSON, or none; nothing was reserved."""

    status = 415
    code = "unsupported-media-type"
    title = "Unsupported media type"


class KeyReusedWithDifferentRequest(OnceflowError):
    """The key was already used in this scope for a request with another fingerprint."""

    status = 422
    code = "idempotency-key-reused"
    title = "Idempotency-Key reused with a different request"


class RequestInProgress(OnceflowError):
    """Another request holds this key's claim and has not marked its task started yet."""

    status = 409
    code = "request-in-progress"
    title = "A request with this Idempotency-Key is in progress"

    def __init__(self, detail: str, *, retry_after_seconds: int, **extensions: Any) -> None:
        super().__init__(detail, **extensions)
        self.retry_after_seconds = retry_after_seconds


class DecisionRefused(OnceflowError):
    """The task refused an approve or reconcile decision; nothing was recorded."""

    status = 409
    code = "decision-refused"
    title = "Decision refused by the task"


class DecisionConflict(OnceflowError):
    """The step was decided otherwise, or the task has ended; nothing was recorded."""

    # Attributes, also the problem document's members: task_state and step_state when the
    # decision arrived, and decision, the step's last accepted one of the same kind if any.

    status = 409
    code = "decision-conflict"
    title = "The task is past this decision"

    def __init__(
        self,
        detail: str,
        *,
        task_state: str,
        step_state: str,
        decision: dict[str, Any] | None = None,
        **extensions: Any,
    ) -> None:
        super().__init__(
            detail, task_state=task_state, step_state=step_state, decision=decision, **extensions
        )
        self.task_state = task_state
        self.step_state = step_state
        self.decision = decision


class CallRefused(OnceflowError):
    """An open task refused a call before anything was recorded; ``reason`` says why."""

    # The task's own words are the detail and ``reason``: the task is closed or closing,
    # its budget or deadline is spent, the tool is not allowed, the arguments do not
    # validate, or the call id names another call.

    status = 409
    code = "call-refused"
    title = "Call refused by the task"

    def __init__(self, detail: str, *, reason: str | None = None, **extensions: Any) -> None:
        super().__init__(detail, reason=detail if reason is None else reason, **extensions)
        self.reason = detail if reason is None else reason


class TaskNotOpen(OnceflowError):
    """A call or close aimed at a plan, whose steps were all given when it started."""

    status = 409
    code = "task-not-open"
    title = "The task is a plan, not an open task"


class QuotaExceeded(OnceflowError):
    """The principal created more new idempotency keys than its quota allows."""

    status = 429
    code = "key-quota-exceeded"
    title = "Idempotency-key quota exceeded"

    def __init__(self, detail: str, *, retry_after_seconds: int, **extensions: Any) -> None:
        super().__init__(detail, **extensions)
        self.retry_after_seconds = retry_after_seconds


class BackendUnavailable(OnceflowError):
    """Temporal or PostgreSQL could not be reached; a retry with the same key is safe."""

    status = 503
    code = "backend-unavailable"
    title = "Service temporarily unavailable"

    def __init__(self, detail: str, *, retry_after_seconds: int = 2, **extensions: Any) -> None:
        super().__init__(detail, **extensions)
        self.retry_after_seconds = retry_after_seconds


class TaskUnanswered(BackendUnavailable):
    """The task exists but did not answer; reading again after ``Retry-After`` is safe."""

    # No worker took its query in time, or its workflow task fails: ``detail`` says
    # which, from what Temporal holds without a worker.

    code = "task-unanswered"
    title = "Task did not answer"


class TaskBusy(BackendUnavailable):
    """The task takes as many calls and decisions at once as Temporal allows; retry later."""

    # Ten Updates in flight per workflow: nothing reached it, and a retry with the same
    # key after ``Retry-After`` is safe. Both backends are up: not a 503.

    status = 429
    code = "task-busy"
    title = "Task busy"

    def __init__(self, detail: str, *, retry_after_seconds: int = 1, **extensions: Any) -> None:
        super().__init__(detail, retry_after_seconds=retry_after_seconds, **extensions)


class NotReady(BackendUnavailable):
    """``GET /readyz``: PostgreSQL or Temporal does not answer; ``checks`` says which."""

    code = "not-ready"
    title = "Not ready"


ANSWERED_ERRORS: tuple[type[OnceflowError], ...] = (
    Unauthenticated,
    ToolNotAllowed,
    DecisionsNotAllowed,
    OriginNotAllowed,
    PayloadNotDecodable,
    UnknownToolRequested,
    TaskNotFound,
    MissingIdempotencyKey,
    MalformedIdempotencyKey,
    InvalidRequest,
    RequestTooLarge,
    UnsupportedMediaType,
    KeyReusedWithDifferentRequest,
    RequestInProgress,
    DecisionRefused,
    DecisionConflict,
    CallRefused,
    TaskNotOpen,
    QuotaExceeded,
    BackendUnavailable,
    TaskUnanswered,
    TaskBusy,
    NotReady,
)
"""Every error the boundary answers a request with: the problem types its API documents."""


def replayed_problem(problem: Mapping[str, Any]) -> OnceflowError:
    """The refusal a stored problem document records, flagged ``replayed``.

    A keyed decision or call the task refused keeps that refusal as its result, so every
    retry with the key gets the same document back, as a replay.

    Raises:
        ValueError: The document is not one of the refusals a record can hold.
    """
    code = str(problem.get("type", "")).removeprefix(PROBLEM_BASE)
    kinds = {kind.code: kind for kind in _STORED_REFUSALS}
    if code not in kinds:
        raise ValueError(f"a record holds no refusal of type {code!r}")
    extensions = {
        name: value
        for name, value in problem.items()
        if name not in ("type", "title", "status", "detail")
    }
    error = kinds[code](str(problem.get("detail", "")), **extensions)
    error.replayed = True
    return error


_STORED_REFUSALS: tuple[type[OnceflowError], ...] = (DecisionRefused, DecisionConflict, CallRefused)
"""The refusals an idempotency record keeps as its result: the task's own answers."""


def validation_problems(
    invalid: ValidationError | Iterable[Mapping[str, Any]], *, location: Sequence[str | int] = ()
) -> list[dict[str, Any]]:
    """Where and what of each validation problem, never the offending input (it may hold
    a secret): ``[{"loc": [...], "msg": "..."}]``, each ``loc`` under ``location``."""
    errors = invalid.errors() if isinstance(invalid, ValidationError) else invalid
    return [{"loc": [*location, *error["loc"]], "msg": error["msg"]} for error in errors]


def describe_validation(
    invalid: ValidationError | Iterable[Mapping[str, Any]], *, whole: str = "input", limit: int = 0
) -> str:
    """Every validation problem on one line, ``field.path: message; ...``; ``whole`` names
    a problem of the value as a whole; ``limit`` (0: none) keeps the first problems."""
    problems = validation_problems(invalid)
    shown = problems[:limit] if limit else problems
    return "; ".join(
        f"{'.'.join(str(part) for part in problem['loc']) or whole}: {problem['msg']}"
        for problem in shown
    )
