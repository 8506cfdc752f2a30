"""The chaos run's far sides in one process of their own: provider, SMTP sink, deploy target.

``python -m tests.chaos.harness.far_sides`` serves the local Stripe-compatible provider,
the SMTP sink (with its JSON side door) and the deployment target on ephemeral ports of
127.0.0.1, prints one JSON line with their addresses, and serves until SIGTERM. They run
apart from the chaos driver so that the driver's own load never delays a far side's
answer, and everything the driver does to them (faults in, records out) goes over HTTP,
as it would to a real provider.
"""

import asyncio
import json
import signal
import sys
from contextlib import suppress

from onceflow_devstack.deploy_target import running_deploy_target
from onceflow_devstack.smtp_sink import running_smtp_sink
from onceflow_devstack.stripe_provider import ProviderConfig, running_provider

STEP_SECONDS = 0.02
"""Simulated work per deployment step: long enough to be interrupted, short enough to run
hundreds of deployments in a CI-size run."""


async def serve() -> None:
    """Serve the three far sides until SIGTERM or SIGINT."""
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopped.set)
    async with (
        running_provider(ProviderConfig()) as provider,
        running_smtp_sink(control_port=0) as sink,
        running_deploy_target(step_seconds=STEP_SECONDS) as target,
    ):
        print(
            json.dumps(
                {
                    "provider_url": provider.base_url,
                    "smtp_url": sink.smtp_url,
                    "smtp_control_url": sink.control_url,
                    "deploy_target_url": target.url,
                }
            ),
            flush=True,
            file=sys.stdout,
        )
        await stopped.wait()


if __name__ == "__main__":
    with suppress(KeyboardInterrupt):
        asyncio.run(serve())
