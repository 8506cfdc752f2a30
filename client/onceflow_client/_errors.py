"""The gateway's refusals as exceptions: one class per status the gateway documents, and
within a status one per problem type a caller acts on differently. Each carries the RFC
9457 problem document, its fields, and ``retry_after`` (seconds, from ``Retry-After``)::

    OnceflowError                   any refusal: status, problem_type, title, detail,
    │                               problem, key_digest, retry_after, replayed
    ├── BadRequest                  400 (413, 415, a 422 other than key reuse): the request
    │   │                           as sent is wrong (``errors`` says where); fix it
    │   └── InvalidIdempotencyKey   400: the Idempotency-Key is missing, too long, or
    │                               outside its alphabet
    ├── Unauthenticated             401: no API key, or an unknown or revoked one
    ├── PermissionDenied            403: the principal may not call this tool (or decide)
    ├── NotFound                    404: no such tool, or no such task for this tenant
    ├── Conflict                    409
    │   ├── RequestInProgress       another request with the key is starting the task or
    │   │                           call: retry with the same key after ``retry_after``
    │   ├── CallRefused             an open task refused a call (``reason``), or the task
    │   │                           is a plan, not an open task
    │   └── DecisionConflict        the task refused an approve or reconcile, or is past it
    ├── IdempotencyKeyReused        422: the key names a different earlier request
    ├── RateLimited                 429: too many new keys in the principal's quota window
    └── BackendUnavailable          503: Temporal or PostgreSQL unreachable; the same key
                                    is safe to send again after ``retry_after``

Any other status (a 500, or a proxy's 502) is a plain ``OnceflowError``.
"""

import email.utils
import math
from datetime import UTC, datetime
from typing import Any

import httpx

PROBLEM_BASE = "urn:onceflow:problem:"
REPLAYED_HEADER = "Idempotent-Replayed"


class OnceflowError(Exception):
    """The gateway refused a request; ``problem`` is its RFC 9457 document.

    Args:
        status: The HTTP status.
        problem: The problem document (``type``, ``title``, ``status``, ``detail`` and the
            problem's own members).
        retry_after: Seconds the gateway asked the caller to wait (``Retry-After``).
            Default None: it asked for no wait.
        replayed: Whether the refusal is the stored answer of an earlier request with the
            same key (``Idempotent-Replayed: true``). Default False.
    """

    def __init__(
        self,
        status: int,
        problem: dict[str, Any],
        *,
        retry_after: float | None = None,
        replayed: bool = False,
    ) -> None:
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', '')}")
        self.status = status
        self.problem = problem
        self.retry_after = retry_after
        """Seconds to wait before sending the request again (``Retry-After``, given in
        seconds or as an HTTP date); None when the gateway asked for no wait."""
        self.replayed = replayed

    @property
    def problem_type(self) -> str:
        """The problem's type slug, e.g. ``idempotency-key-reused`` (``about:blank`` for an
        answer that is not one of onceflow's problems)."""
        return str(self.problem.get("type", "")).removeprefix(PROBLEM_BASE)

    @property
    def title(self) -> str:
        """The problem type's short summary."""
        return str(self.problem.get("title", ""))

    @property
    def detail(self) -> str:
        """What went wrong with this request (never a raw key or request body)."""
        return str(self.problem.get("detail", ""))

    @property
    def key_digest(self) -> str | None:
        """The digest of the idempotency key concerned (``sha256:…``), as the gateway logs
        it, when the problem is about a key."""
        value = self.problem.get("key_digest")
        return str(value) if value is not None else None


class BadRequest(OnceflowError):
    """The request as sent is refused (invalid body or arguments, too large, not JSON);
    nothing was reserved. Fix it; sending it again unchanged cannot succeed."""

    @property
    def errors(self) -> list[dict[str, Any]]:
        """Where and what failed validation (``loc``, ``msg``), without the values."""
        errors = self.problem.get("errors")
        return [error for error in errors if isinstance(error, dict)] if errors else []


class InvalidIdempotencyKey(BadRequest):
    """The Idempotency-Key is missing, too long or outside its alphabet; nothing was
    reserved."""


class Unauthenticated(OnceflowError):
    """No API key, or one that is unknown or revoked."""


class PermissionDenied(OnceflowError):
    """The principal may not call this tool, or may not approve or reconcile tasks."""


class NotFound(OnceflowError):
    """No tool of that name, or no task of that id for the principal's tenant."""


class Conflict(OnceflowError):
    """A 409: the request conflicts with the key's or the task's state."""


class RequestInProgress(Conflict):
    """Another request with this key is starting the task; retry with the same key."""


class CallRefused(Conflict):
    """An open task refused a call before anything was recorded (it is closed or closing,
    its budget or deadline is spent, the call id names another call), or the task is a
    plan. Send a corrected call with a new key; this key keeps the refusal."""

    @property
    def reason(self) -> str:
        """The task's reason, in its own words."""
        return str(self.problem.get("reason") or self.problem.get("detail", ""))


class DecisionConflict(Conflict):
    """The task refused an approve or reconcile decision, or is past it (the step was
    decided otherwise, or the task ended); nothing was recorded."""


class IdempotencyKeyReused(OnceflowError):
    """The key was used before for a different request; use a new key."""


class RateLimited(OnceflowError):
    """The principal created more new idempotency keys than its quota allows in the
    current window; ``retry_after`` says when the next window starts."""


class BackendUnavailable(OnceflowError):
    """Temporal or PostgreSQL could not be reached; the same request with the same key is
    safe to send again after ``retry_after``."""


_BY_TYPE: dict[str, type[OnceflowError]] = {
    "idempotency-key-missing": InvalidIdempotencyKey,
    "idempotency-key-malformed": InvalidIdempotencyKey,
    "idempotency-key-reused": IdempotencyKeyReused,
    "request-in-progress": RequestInProgress,
    "call-refused": CallRefused,
    "task-not-open": CallRefused,
    "decision-conflict": DecisionConflict,
    "decision-refused": DecisionConflict,
}
_BY_STATUS: dict[int, type[OnceflowError]] = {
    400: BadRequest,
    401: Unauthenticated,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    413: BadRequest,
    415: BadRequest,
    422: BadRequest,
    429: RateLimited,
    503: BackendUnavailable,
}


def problem_error(response: httpx.Response) -> OnceflowError | None:
    """The exception of a refusal (status 400 or above); None for any other answer."""
    if response.status_code < 400:
        return None
    try:
        problem = response.json()
    except ValueError:
        problem = None
    if not isinstance(problem, dict):
        # Not a problem document (a proxy's error page): keep its gist, not its markup.
        problem = {
            "type": "about:blank",
            "title": response.reason_phrase,
            "status": response.status_code,
            "detail": response.text[:200],
        }
    kind = str(problem.get("type", "")).removeprefix(PROBLEM_BASE)
    error_class = _BY_TYPE.get(kind) or _BY_STATUS.get(response.status_code, OnceflowError)
    return error_class(
        response.status_code,
        problem,
        retry_after=parse_retry_after(response.headers.get("Retry-After")),
        replayed=response.headers.get(REPLAYED_HEADER) == "true",
    )


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` value asks to wait: delay-seconds, or an HTTP date (a
    date already past is 0). None when there is no value or it is neither."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a zone-less one is read as such
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)
