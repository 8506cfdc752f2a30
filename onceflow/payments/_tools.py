"""The two payment tools under their settings, sharing one Stripe client per worker."""

from functools import partial

from onceflow.payments._contract import charge_payment_contract, refund_payment_contract
from onceflow.payments._look_ups import look_up_charge, look_up_refund
from onceflow.payments._perform import charge_payment, refund_payment
from onceflow.payments._settings import PaymentToolSettings, StripeSettings
from onceflow.payments._stripe import open_stripe_provider
from onceflow.settings import InvalidSettings
from onceflow.tools import Tool


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
