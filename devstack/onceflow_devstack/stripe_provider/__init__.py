"""A local Stripe-compatible provider for onceflow's dev stack and tests.

Far-side test infrastructure, never imported by product code: an aiohttp server that
speaks Stripe's wire format for PaymentIntents (create, confirm, retrieve, list, search)
and Refunds (create, retrieve, list), honours Stripe's idempotency rules, keeps a ledger
of every effect it committed and a log of every request, and injects faults on demand, so
the official ``stripe`` SDK talks to it unchanged::

    async with running_provider(ProviderConfig(key_retention_seconds=2)) as running:
        client = stripe.StripeClient(
            "sk_test_local",
            base_addresses={"api": running.base_url},
            max_network_retries=0,
            http_client=stripe.HTTPXClient(timeout=0.5),
        )
        async with ProviderControl(running.base_url) as control:
            await control.add_fault(Fault.DROP_AFTER_COMMIT, path_prefix="/v1/payment_intents")
            ...
            assert len(await control.ledger()) == 1
"""

from ._app import PROVIDER, Provider, ProviderConfig, build_provider_app
from ._control import ProviderControl
from ._faults import Fault, FaultPlan, FaultRule
from ._ledger import Account, LedgerEntry, RequestRecord
from ._server import RunningProvider, provider_in_thread, running_provider, serve

__all__ = [
    "PROVIDER",
    "Account",
    "Fault",
    "FaultPlan",
    "FaultRule",
    "LedgerEntry",
    "Provider",
    "ProviderConfig",
    "ProviderControl",
    "RequestRecord",
    "RunningProvider",
    "build_provider_app",
    "provider_in_thread",
    "running_provider",
    "serve",
]
