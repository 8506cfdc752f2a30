"""Classifies every outcome of a Stripe call into an outcome class, once, for all callers.

The SDK's exception tree and where each branch lands::

    stripe.StripeError
     ├── CardError            402 card_declined, …            ─▶ rejected
     ├── InvalidRequestError  400/404 (bad params, missing)    ─▶ rejected
     ├── IdempotencyError     400 idempotency_error            ─▶ rejected, logged as a bug
     ├── AuthenticationError  401                              ─▶ rejected
     ├── PermissionError      403                              ─▶ rejected
     ├── RateLimitError       429                              ─▶ transient
     ├── APIConnectionError   no HTTP answer; by its cause:
     │    ├── httpx.ConnectError, ConnectTimeout, PoolTimeout  ─▶ transient (never sent)
     │    └── ReadTimeout, WriteTimeout, RemoteProtocolError,
     │        ReadError, WriteError, anything else            ─▶ unknown (maybe sent)
     └── APIError             plain: 409, 5xx, no status; by status:
          ├── 409 idempotency_key_in_use (code is None on the
          │   exception: read ``err.error.code``)              ─▶ transient
          ├── 500, 502, 503, 504, …                            ─▶ unknown
          └── anything else                                    ─▶ unknown
    any other exception                                        ─▶ unknown

Why these classes:

- A 409 ``idempotency_key_in_use`` means another request with the same key is still
  running; *this* request did nothing, and a later repeat replays that request's result.
- A 5xx may come after Stripe committed the effect, so it is ``unknown``. Stripe stores
  the 500 under the key and replays it for every repeat within the key's retention
  (``Idempotent-Replayed: true``): repeating cannot turn it into a success. A repeat is
  still harmless, so the workflow's budget may spend its few attempts on it; the budget
  caps them, then the step's lookup searches for the effect, and parks if it finds
  nothing. ``PaymentProviderError.replayed`` tells callers a 5xx was a replay, so they
  can look the effect up at once instead of waiting for the budget to run out.
- ``idempotency_error`` means one of our derived keys reached Stripe with other
  parameters. A derived key covers exactly one child operation whose parameters are fixed
  by the step's arguments, so this is a bug in onceflow, never the caller's fault.
- A connection reset after the request was written is ``unknown``: the provider may
  have committed before the connection died. Only failures that prove the request never
  left this process (the connection was never established, or no pooled connection was
  free) are ``transient``.
"""

import logging
from datetime import timedelta

import httpx
import stripe

from onceflow.retry_policy import OutcomeClass

_log = logging.getLogger(__name__)

_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class PaymentProviderError(Exception):
    """A provider call that did not succeed, already classified.

    Raised by every ``PaymentProvider`` method, so activities never see a provider SDK's
    own exceptions.
    """

    def __init__(
        self,
        outcome: OutcomeClass,
        reason: str,
        *,
        request_id: str | None = None,
        http_status: int | None = None,
        code: str | None = None,
        replayed: bool = False,
        payment_intent: str | None = None,
        retry_after: timedelta | None = None,
    ) -> None:
        super().__init__(reason)
        self.outcome = outcome
        """How the call ended (never ``succeeded``)."""
        self.reason = reason
        """Why, in words an operator can act on; never holds keys or card data."""
        self.request_id = request_id
        """The provider's request id, when it answered."""
        self.http_status = http_status
        """The HTTP status, when it answered."""
        self.code = code
        """The provider's machine-readable error code, if any."""
        self.replayed = replayed
        """The answer was a stored response replayed for the same idempotency key."""
        self.payment_intent = payment_intent
        """The PaymentIntent an error names (a declined card leaves one behind)."""
        self.retry_after = retry_after
        """A 429's ``Retry-After``, when it named one."""

    @property
    def throttled(self) -> bool:
        """Stripe refused the request as one too many (429): nothing was done."""
        return self.http_status == 429


def retry_after(headers: object) -> timedelta | None:
    """The wait a response's ``Retry-After`` header asks for, in seconds (its HTTP-date
    form is not used by Stripe), or None."""
    value = headers.get("retry-after") if hasattr(headers, "get") else None
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return timedelta(seconds=min(seconds, 3600)) if seconds is not None and seconds >= 0 else None


def classify_stripe_error(error: BaseException) -> tuple[OutcomeClass, str]:
    """The outcome class of a failed Stripe call and a reason safe to show.

    Logs an ``idempotency_error`` at ERROR level: it can only come from a bug in how
    onceflow derives keys or builds parameters.

    Args:
        error: What the ``stripe`` SDK (or the HTTP layer under it) raised.

    Returns:
        The outcome class (never ``succeeded``) and a one-line reason.
    """
    if isinstance(error, stripe.IdempotencyError):
        _log.error(
            "Stripe refused a derived idempotency key reused with other parameters "
            "(request %s): this is a bug in onceflow's child-key derivation",
            error.request_id,
        )
        return OutcomeClass.REJECTED, (
            "Stripe refused the idempotency key: it was used before with other parameters "
            "(a bug in onceflow, reported in the worker log)"
        )
    if isinstance(error, stripe.CardError):
        decline = error.error.decline_code if error.error is not None else None
        detail = f"{error.code or 'card_error'}" + (f" ({decline})" if decline else "")
        return OutcomeClass.REJECTED, f"the card was declined: {detail}"
    if isinstance(error, stripe.RateLimitError):
        return OutcomeClass.TRANSIENT, "Stripe rate-limited the request (429); nothing was done"
    if isinstance(error, stripe.InvalidRequestError):
        return OutcomeClass.REJECTED, (
            f"Stripe rejected the request ({error.http_status} {error.code or 'invalid_request'}"
            f"{f', param {error.param}' if error.param else ''}): {error.user_message}"
        )
    if isinstance(error, stripe.AuthenticationError | stripe.PermissionError):
        return OutcomeClass.REJECTED, (
            f"Stripe refused the API key ({error.http_status}); check STRIPE_API_KEY"
        )
    if isinstance(error, stripe.APIConnectionError):
        return _classify_connection_error(error)
    if isinstance(error, stripe.APIError):
        return _classify_api_error(error)
    if isinstance(error, stripe.StripeError):
        return OutcomeClass.UNKNOWN, (
            f"unexpected Stripe error {type(error).__name__} ({error.http_status}); "
            "the effect may have happened"
        )
    return OutcomeClass.UNKNOWN, (
        f"unexpected failure calling Stripe ({type(error).__name__}); the effect may have happened"
    )


def stripe_error_code(error: stripe.StripeError) -> str | None:
    """The error's machine-readable code; plain ``APIError`` keeps it only in ``error``."""
    if error.code:
        return error.code
    return error.error.code if error.error is not None else None


def _classify_connection_error(error: stripe.APIConnectionError) -> tuple[OutcomeClass, str]:
    cause = error.__cause__
    if isinstance(cause, _NEVER_SENT):
        return OutcomeClass.TRANSIENT, (
            f"could not connect to Stripe ({type(cause).__name__}); the request was never sent"
        )
    if isinstance(cause, httpx.TimeoutException):
        what = f"timed out waiting for Stripe ({type(cause).__name__})"
    elif cause is not None:
        what = f"the connection to Stripe failed after sending ({type(cause).__name__})"
    else:
        what = "the connection to Stripe failed"
    return OutcomeClass.UNKNOWN, f"{what}; the effect may have happened"


def _classify_api_error(error: stripe.APIError) -> tuple[OutcomeClass, str]:
    status, code = error.http_status, stripe_error_code(error)
    if status == 409:
        return OutcomeClass.TRANSIENT, (
            f"another request with the same idempotency key is still running (409 {code}); "
            "a later repeat gets its result"
        )
    replay = " (a stored response replayed for the same key)" if is_replay(error) else ""
    return OutcomeClass.UNKNOWN, (
        f"Stripe answered {status or 'an error'}{replay}; the effect may have happened"
    )


def is_replay(error: stripe.StripeError) -> bool:
    """Whether Stripe answered with a response stored under the idempotency key."""
    return (error.headers or {}).get("idempotent-replayed") == "true"
