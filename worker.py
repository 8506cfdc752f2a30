"""The onceflow worker process: runs task workflows and tool activities on one task queue.

Run as ``onceflow worker`` or ``python worker.py``; run several on one task queue to
scale out. SIGTERM or SIGINT shuts it down gracefully: running activities get
``ONCEFLOW_SHUTDOWN_GRACE`` to finish before the process exits.
"""

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client
from temporalio.worker import Worker

from activities import build_activities
from settings import OnceflowSettings
from storage import build_pool
from task_api import connect_temporal
from workflows import AgentTaskWorkflow


def build_worker(
    client: Client,
    pool: AsyncConnectionPool,
    settings: OnceflowSettings,
    *,
    extra_activities: tuple[Callable[..., Any], ...] = (),
) -> Worker:
    """The one composition point: workflows and every activity with its clients."""
    return Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[AgentTaskWorkflow],
        activities=[*build_activities(pool), *extra_activities],
        graceful_shutdown_timeout=timedelta(seconds=settings.shutdown_grace_seconds),
    )


async def serve_worker(
    settings: OnceflowSettings,
    *,
    database_url: str,
    stop: asyncio.Event,
    temporal_address: str | None = None,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Poll for work until ``stop`` is set, then drain within the shutdown grace."""
    client = await connect_temporal(address=temporal_address)
    async with build_pool(database_url, max_size=settings.db_pool_max_size) as pool:
        # Leaving the block calls worker.shutdown(): no new work is taken and running
        # activities get the grace period, so their completions are not dropped.
        async with build_worker(client, pool, settings):
            if on_ready is not None:
                on_ready()
            await stop.wait()


def main() -> None:
    """Entry point for ``python worker.py``: the same as ``onceflow worker``."""
    from cli.main import run

    run(["worker"])


if __name__ == "__main__":
    main()
