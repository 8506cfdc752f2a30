"""onceflow's Nexus service on real servers: the dev server (its Nexus endpoint created
as ``onceflow dev`` creates it), PostgreSQL, and the local Stripe-compatible provider as
the far side; payments fixtures shared with ``tests/payments``."""

from tests.payments.conftest import (  # noqa: F401 - fixtures
    control,
    payment_provider,
    pool,
    provider,
)
