"""The payment tools, ``charge_payment`` and ``refund_payment``: Stripe through the official
SDK with its own retries off, built on the public tool API like any user's tool.

``payment_tools(tool_settings, stripe)`` returns both tools; ``payment_family`` is what
every process loads: the tools under its settings, with ``STRIPE_API_KEY`` as the service
a worker needs, the Stripe secrets to redact and the Stripe client's retry check. Their
client is one ``StripePaymentProvider`` per worker (a ``PaymentProvider``, the small protocol other
providers can implement), and every failure reaches a perform as a
``PaymentProviderError`` already classified by ``classify_stripe_error``::

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

from onceflow.payments._audit import (
    AUDITED_TOOLS,
    PaymentsAuditInput,
    ProviderEffect,
    compare_payments,
)
from onceflow.payments._audit_io import AuditedPaymentProvider, PaymentsAuditor
from onceflow.payments._contract import (
    STRIPE,
    ChargePaymentInput,
    RefundPaymentInput,
    charge_payment_contract,
    refund_payment_contract,
)
from onceflow.payments._errors import PaymentProviderError, classify_stripe_error
from onceflow.payments._family import (
    STRIPE_CLIENT_CHECK,
    STRIPE_REDACTIONS,
    payment_family,
    stripe_client_retries,
)
from onceflow.payments._outcomes import CHARGE_CHILD_OP, REFUND_CHILD_OP
from onceflow.payments._provider import (
    OPERATION_METADATA_KEY,
    ChargeRequest,
    PaymentIntentView,
    PaymentProvider,
    ProviderReply,
    RefundRequest,
    RefundView,
)
from onceflow.payments._settings import PaymentToolSettings, StripeSettings
from onceflow.payments._stripe import (
    StripePaymentProvider,
    build_stripe_client,
    open_stripe_provider,
)
from onceflow.payments._tools import payment_tools

__all__ = [
    "AUDITED_TOOLS",
    "CHARGE_CHILD_OP",
    "OPERATION_METADATA_KEY",
    "REFUND_CHILD_OP",
    "STRIPE",
    "STRIPE_CLIENT_CHECK",
    "STRIPE_REDACTIONS",
    "AuditedPaymentProvider",
    "ChargePaymentInput",
    "ChargeRequest",
    "PaymentIntentView",
    "PaymentProvider",
    "PaymentProviderError",
    "PaymentToolSettings",
    "PaymentsAuditInput",
    "PaymentsAuditor",
    "ProviderEffect",
    "ProviderReply",
    "RefundPaymentInput",
    "RefundRequest",
    "RefundView",
    "StripePaymentProvider",
    "StripeSettings",
    "build_stripe_client",
    "charge_payment_contract",
    "classify_stripe_error",
    "compare_payments",
    "open_stripe_provider",
    "payment_family",
    "payment_tools",
    "refund_payment_contract",
    "stripe_client_retries",
]
