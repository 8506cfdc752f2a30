"""The onceflow worker process: runs task workflows and tool activities on one task queue.

Run as ``onceflow worker`` or ``python worker.py``; run several on one task queue to
scale out. SIGTERM or SIGINT shuts it down gracefully: running activities get
``ONCEFLOW_SHUTDOWN_GRACE`` to finish before the process exits.
"""

import asyncio
from collections.abc import Callable
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import Any

from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client
from temporalio.worker import Worker

from onceflow.activities import build_activities
from onceflow.deployments import DeployTarget, DeployTargetSettings, open_deploy_target
from onceflow.email import EmailSettings
from onceflow.payments import PaymentProvider, StripeSettings, open_stripe_provider
from onceflow.settings import OnceflowSettings
from onceflow.storage import build_pool
from onceflow.task_api import connect_temporal
from onceflow.telemetry import AttemptAnnotations, watch_parked_tasks
from onceflow.tools import load_configured_tools, open_tool_client, tool_activities
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.pruning import PruneIdempotencyRecordsWorkflow


def build_worker(
    client: Client,
    pool: AsyncConnectionPool,
    settings: OnceflowSettings,
    *,
    payment_provider: PaymentProvider | None = None,
    deploy_target: DeployTarget | None = None,
    email_settings: EmailSettings | None = None,
    extra_activities: tuple[Callable[..., Any], ...] = (),
) -> Worker:
    """The one composition point: workflows and every activity with its clients.

    Tracing comes with ``client`` (``connect_temporal`` puts Temporal's interceptor on it,
    and a worker inherits its client's); ``AttemptAnnotations`` adds onceflow's fields to
    each attempt's span and logs one line per attempt.
    """
    return Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[AgentTaskWorkflow, PruneIdempotencyRecordsWorkflow],
        activities=[
            *build_activities(
                pool,
                payment_provider=payment_provider,
                deploy_target=deploy_target,
                email_settings=email_settings,
            ),
            *extra_activities,
        ],
        graceful_shutdown_timeout=timedelta(seconds=settings.shutdown_grace_seconds),
        interceptors=[AttemptAnnotations()],
    )


async def serve_worker(
    settings: OnceflowSettings,
    *,
    database_url: str,
    stop: asyncio.Event,
    temporal_address: str | None = None,
    on_ready: Callable[[], None] | None = None,
    stripe: StripeSettings | None = None,
    deploy_target: DeployTargetSettings | None = None,
) -> None:
    """Poll for work until ``stop`` is set, then drain within the shutdown grace.

    ``stripe`` defaults to ``StripeSettings()`` (``STRIPE_API_KEY``, ``STRIPE_API_BASE``);
    ``deploy_target`` to ``DeployTargetSettings()`` (``DEPLOY_TARGET_URL``). Email
    settings come from ``EmailSettings()``; relays run apart (``onceflow relay``). When
    the process exports metrics, the worker also publishes the parked-task gauges.
    The custom tools of ``settings.tools`` are loaded and registered first, and their
    clients opened for the worker's lifetime; an unsafe tool stops the start-up with
    ``ToolRegistrationError``.
    """
    custom_tools = load_configured_tools(settings.tools)
    client = await connect_temporal(address=temporal_address)
    async with (
        watch_parked_tasks(client, every=timedelta(seconds=settings.parked_scan_seconds)),
        build_pool(database_url, max_size=settings.db_pool_max_size) as pool,
        open_stripe_provider(stripe or StripeSettings()) as payment_provider,
        open_deploy_target(deploy_target or DeployTargetSettings()) as target,
        AsyncExitStack() as tool_clients,
    ):
        custom_activities = [
            activity
            for tool in custom_tools
            for activity in tool_activities(tool, pool, await open_tool_client(tool, tool_clients))
        ]
        # Leaving the block calls worker.shutdown(): no new work is taken and running
        # activities get the grace period, so their completions are not dropped.
        async with build_worker(
            client,
            pool,
            settings,
            payment_provider=payment_provider,
            deploy_target=target,
            email_settings=EmailSettings(),
            extra_activities=tuple(custom_activities),
        ):
            if on_ready is not None:
                on_ready()
            await stop.wait()


def main() -> None:
    """Entry point for ``python worker.py``: the same as ``onceflow worker``."""
    from onceflow.cli import main as onceflow

    onceflow(["worker"])


if __name__ == "__main__":
    main()
