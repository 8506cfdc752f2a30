"""onceflow's payment integration: Stripe through the official SDK, nested retries off.

Activities talk to a ``PaymentProvider`` (a small protocol) and get plain values back or
a ``PaymentProviderError`` that already carries its outcome class; the Stripe
implementation classifies SDK failures with ``classify_stripe_error``::

    outcome of a Stripe call                             class       the workflow then
    ─────────────────────────────────────────────────    ─────────   ─────────────────────
    2xx                                                  succeeded   next step
    402 card declined, 400/404 invalid, 401/403 auth     rejected    fails the step
    400 idempotency_error (same key, other parameters)   rejected    fails it; logged as a bug
    429 rate limited                                     transient   retries within budget
    409 idempotency_key_in_use                           transient   retries within budget
    no connection made (refused, connect timeout)        transient   retries within budget
    timeout or reset after sending                       unknown     repeats the same key while
    5xx (a 500 is stored and replayed for the key)       unknown     Stripe keeps it, else
                                                                     looks up, else parks

Nothing here imports the dev stack; point ``STRIPE_API_BASE`` at the local provider to
use it.
"""

from onceflow.payments._errors import PaymentProviderError, classify_stripe_error
from onceflow.payments._provider import (
    OPERATION_METADATA_KEY,
    ChargeRequest,
    PaymentIntentView,
    PaymentProvider,
    ProviderReply,
    RefundRequest,
    RefundView,
)
from onceflow.payments._settings import StripeSettings
from onceflow.payments._stripe import (
    StripePaymentProvider,
    build_stripe_client,
    open_stripe_provider,
)

__all__ = [
    "OPERATION_METADATA_KEY",
    "ChargeRequest",
    "PaymentIntentView",
    "PaymentProvider",
    "PaymentProviderError",
    "ProviderReply",
    "RefundRequest",
    "RefundView",
    "StripePaymentProvider",
    "StripeSettings",
    "build_stripe_client",
    "classify_stripe_error",
    "open_stripe_provider",
]
