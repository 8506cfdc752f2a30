"""Failure classification for tool authors: map what went wrong to an ``OutcomeClass``.

The question is always the same: could the effect have happened? Only a failure that
proves the request never left (refused connection, no DNS, no pool slot) is
``transient``; a request the server answered with a refusal is ``rejected``; anything
after sending without a definite answer is ``unknown``.

    NothingSent            raise it from a tool when you know nothing was sent: transient
      KeyWindowClosed      raised by ``begin`` past the key's send-by deadline: look up, park
      DatabaseUnavailable  onceflow's own database unreachable: wait for it, within the deadline
    classify_http_status   an HTTP answer's status code
    classify_http_error    an exception from httpx, aiohttp, requests or the socket layer
    classify_database_error  an exception from psycopg (re-exported from onceflow storage)
"""

import socket
import ssl
import sys

import httpx

from onceflow.retry_policy import OutcomeClass


class NothingSent(Exception):
    """The attempt failed before anything reached the far side: safe to try again."""


class KeyWindowClosed(NothingSent):
    """The child key's send-by deadline has passed, so nothing was sent: the provider may
    have forgotten the key, and a send could make a second effect. Raised by
    ``ToolCall.begin``; the attempt ends with ``KeyUnusable.SEND_BY_PASSED`` and the
    workflow looks the effect up, then parks."""

    def __init__(self, reason: str, evidence: dict[str, str]) -> None:
        super().__init__(reason)
        self.evidence = evidence
        """The key's digest, its first send and its send-by deadline."""


class DatabaseUnavailable(NothingSent):
    """onceflow's own database could not be reached, so the attempt stopped before its
    effect (raised by ``begin`` and ``find``; raise it from a tool whose own queries find
    the database down). The workflow waits for the database and retries, bounded by the
    task's deadline but not by its attempt caps: an outage of onceflow's database is not
    a failing provider, and a local effect is deduplicated by its operation record."""


_TRY_LATER = frozenset({408, 425, 429})
"""Answers that refuse the request before processing it."""
_MAYBE_DONE = frozenset({500, 502, 504})
"""A server error or a proxy's timeout: the upstream may have committed before failing."""
_HTTPX_NOT_SENT = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
)
_AIOHTTP_NOT_SENT = ("ClientConnectorError", "ConnectionTimeoutError")
"""``ClientConnectorError`` covers its DNS, SSL and certificate subclasses."""
_SOCKET_NOT_SENT = (ConnectionRefusedError, socket.gaierror, ssl.SSLCertVerificationError)


def classify_http_status(status: int) -> tuple[OutcomeClass, str]:
    """The outcome class of an HTTP answer, and a reason safe to show.

    2xx succeeded; 408, 425, 429 and 503 were refused before processing (transient);
    409 is a concurrent request holding the same idempotency key (transient: ask again
    later); other 4xx are permanent refusals (rejected); 500, 502, 504 and any other
    5xx may have done the work (unknown). 1xx and 3xx are not final answers (unknown).
    """
    if 200 <= status < 300:
        return OutcomeClass.SUCCEEDED, f"HTTP {status}"
    if status in _TRY_LATER or status == 503:
        return OutcomeClass.TRANSIENT, f"HTTP {status}: refused before processing"
    if status == 409:
        return OutcomeClass.TRANSIENT, "HTTP 409: the same key is still being processed"
    if 400 <= status < 500:
        return OutcomeClass.REJECTED, f"HTTP {status}: the request was refused"
    if status in _MAYBE_DONE or status >= 500:
        return OutcomeClass.UNKNOWN, f"HTTP {status}: the server may have done the work"
    return OutcomeClass.UNKNOWN, f"HTTP {status} is not a final answer"


def classify_http_error(error: BaseException) -> tuple[OutcomeClass, str]:
    """The outcome class of an exception raised while calling an HTTP service.

    Errors before the request was written (connection refused or failed, DNS, TLS
    handshake, connect timeout, no free connection in the pool) are ``transient``; read
    and write timeouts, dropped connections and protocol errors are ``unknown``. An
    exception this function does not know is ``unknown``.
    """
    name = type(error).__name__
    if isinstance(error, NothingSent) or _before_sending(error):
        return OutcomeClass.TRANSIENT, f"the request was not sent ({name})"
    return OutcomeClass.UNKNOWN, f"no answer after sending ({name}); the work may be done"


def _before_sending(error: BaseException) -> bool:
    if isinstance(error, (*_HTTPX_NOT_SENT, *_SOCKET_NOT_SENT)):
        return True
    # aiohttp is not a dependency either: a tool that raised one of its errors imported it.
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None and isinstance(
        error, tuple(getattr(aiohttp, name) for name in _AIOHTTP_NOT_SENT)
    ):
        return True
    # requests is not a dependency: recognise its two not-sent errors by name. Its
    # ConnectionError is not among them, as it also wraps connections dropped mid-answer.
    kind = type(error)
    return kind.__module__.startswith("requests") and kind.__name__ in {
        "ConnectTimeout",
        "SSLError",
    }
