"""The payment tools, ``charge_payment`` and ``refund_payment``: Stripe through the official
SDK with its own retries off, built on the public tool API like any user's tool.

``payment_tools(tool_settings, stripe)`` returns both tools; their client is one
``StripePaymentProvider`` per worker (a ``PaymentProvider``, the small protocol other
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

from functools import partial

from onceflow.payments._audit import (
    AUDITED_TOOLS,
    PaymentsAuditInput,
    ProviderEffect,
    compare_payments,
)
from onceflow.payments._audit_io import AuditedPaymentProvider, PaymentsAuditor
from onceflow.payments._contract import (
    ChargePaymentInput,
    RefundPaymentInput,
    charge_payment_contract,
    refund_payment_contract,
)
from onceflow.payments._errors import PaymentProviderError, classify_stripe_error
from onceflow.payments._perform import (
    CHARGE_CHILD_OP,
    REFUND_CHILD_OP,
    charge_payment,
    look_up_charge,
    look_up_refund,
    refund_payment,
)
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
from onceflow.settings import InvalidSettings
from onceflow.tools import Tool

__all__ = [
    "AUDITED_TOOLS",
    "CHARGE_CHILD_OP",
    "OPERATION_METADATA_KEY",
    "REFUND_CHILD_OP",
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
    "payment_tools",
    "refund_payment_contract",
]


def payment_tools(tool_settings: PaymentToolSettings, stripe: StripeSettings) -> tuple[Tool, Tool]:
    """``charge_payment`` and ``refund_payment`` under these settings.

    Both share one client per worker: the ``StripePaymentProvider`` of ``stripe``
    (``max_network_retries=0``, explicit timeouts), or None without an API key, in which
    case every call is rejected with a reason saying so.

    Args:
        tool_settings: What the workflow decides from (``[tools.payments]``); the same on
            every worker.
        stripe: How this worker reaches Stripe (``[stripe]``).

    Raises:
        InvalidSettings: With an API key set, the attempt timeout does not exceed two
            Stripe calls (an attempt could be cut off while its request is in flight).
    """
    if stripe.configured and tool_settings.attempt_timeout <= 2 * stripe.longest_call:
        raise InvalidSettings(
            f"the payment tools' attempt timeout ({tool_settings.attempt_timeout}) must "
            f"exceed two Stripe calls (2 × {stripe.longest_call}); raise "
            "ONCEFLOW_PAYMENTS_ATTEMPT_TIMEOUT or lower ONCEFLOW_STRIPE_REQUEST_TIMEOUT / "
            "ONCEFLOW_STRIPE_CONNECT_TIMEOUT"
        )
    open_provider = partial(open_stripe_provider, stripe)
    return (
        Tool(
            contract=charge_payment_contract(tool_settings),
            perform=charge_payment,
            look_up=look_up_charge,
            open_client=open_provider,
        ),
        Tool(
            contract=refund_payment_contract(tool_settings),
            perform=refund_payment,
            look_up=look_up_refund,
            open_client=open_provider,
        ),
    )
