"""The payment family as a process loads it: its two tools under the process's settings,
the service they cannot work without, the Stripe secrets to keep out of logs and traces,
and how to see that a Stripe client retries nothing. Loaded like a user's family
(``onceflow.tools.worker.load_families``), so every check applies to it the same way."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from psycopg_pool import AsyncConnectionPool

from onceflow.payments._audit_io import PaymentsAuditor
from onceflow.payments._settings import PaymentToolSettings, StripeSettings
from onceflow.payments._stripe import open_stripe_provider
from onceflow.payments._tools import payment_tools
from onceflow.settings import SettingsSource
from onceflow.tools import Auditor, ClientRetryCheck, Redaction, StartupProblem, ToolFamily

STRIPE_REDACTIONS = (
    Redaction(what="Stripe secret key", pattern=r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9_]{8,}+"),
    Redaction(what="Stripe webhook secret", pattern=r"whsec_[A-Za-z0-9+/=]{16,}+"),
    Redaction(
        what="Stripe client secret",
        pattern=r"(?:pi|seti)_[A-Za-z0-9]{8,}+_secret_[A-Za-z0-9]{8,}+",
    ),
)
"""Stripe's secret and restricted keys, webhook secrets and PaymentIntent/SetupIntent
client secrets. Publishable ``pk_`` keys are public by design and pass."""


def stripe_client_retries(client: Any) -> str | None:
    """The network retries a ``StripeClient`` leaves on (``max_network_retries=2``), or
    None when they are off or ``client`` is no ``StripeClient``."""
    if type(client).__name__ != "StripeClient":
        return None
    import stripe

    options = getattr(getattr(client, "_requestor", None), "_options", None)
    count = getattr(options, "max_network_retries", None)
    if count is None:
        count = stripe.max_network_retries  # a client left at None uses the global default
    return f"max_network_retries={count}" if count else None


STRIPE_CLIENT_CHECK = ClientRetryCheck(
    module="stripe",
    retries=stripe_client_retries,
    fix="build the StripeClient with max_network_retries=0",
)


def payment_family(settings: SettingsSource) -> ToolFamily:
    """``charge_payment`` and ``refund_payment`` under ``[tools.payments]`` and ``[stripe]``
    (``ONCEFLOW_PAYMENTS_*``, ``STRIPE_API_KEY``, ``ONCEFLOW_STRIPE_*``), needing
    ``STRIPE_API_KEY`` to start.

    Raises:
        InvalidSettings: With an API key set, the attempt timeout does not exceed two
            Stripe calls.
    """
    stripe = settings.read(StripeSettings)
    tools = payment_tools(settings.read(PaymentToolSettings), stripe)
    missing = StartupProblem(
        tools=tuple(tool.name for tool in tools),
        problem="STRIPE_API_KEY is not set",
        fix="set it to your Stripe secret key (and STRIPE_API_BASE only to point elsewhere)",
    )
    return ToolFamily(
        name="payments",
        tools=tools,
        problems=() if stripe.configured else (missing,),
        redactions=STRIPE_REDACTIONS,
        client_checks=(STRIPE_CLIENT_CHECK,),
        open_auditor=lambda pool: _open_auditor(stripe, pool),
    )


@asynccontextmanager
async def _open_auditor(
    stripe: StripeSettings, pool: AsyncConnectionPool
) -> AsyncIterator[Auditor | None]:
    """The payments' audit, reading Stripe with a client of its own; None without a key."""
    if not stripe.configured:
        yield None
        return
    async with open_stripe_provider(stripe) as provider:
        yield PaymentsAuditor(provider, pool) if provider is not None else None
