"""The onceflow worker process: runs task workflows and tool activities on one task queue.

Run as ``onceflow worker`` or ``python worker.py``; run several on one task queue to
scale out. SIGTERM or SIGINT shuts it down gracefully: running activities get
``ONCEFLOW_SHUTDOWN_GRACE`` to finish before the process exits.
"""

import asyncio
import signal
from collections.abc import Callable
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
        graceful_shutdown_timeout=settings.shutdown_grace,
    )


async def run_worker(
    settings: OnceflowSettings,
    *,
    database_url: str,
    temporal_address: str | None = None,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Run a worker until SIGTERM/SIGINT, then drain and return."""
    client = await connect_temporal(address=temporal_address)
    async with build_pool(database_url, max_size=settings.db_pool_max_size) as pool:
        worker = build_worker(client, pool, settings)
        loop = asyncio.get_running_loop()
        for stop_signal in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(stop_signal, lambda: asyncio.ensure_future(worker.shutdown()))
        try:
            if on_ready is not None:
                on_ready()
            await worker.run()
        finally:
            for stop_signal in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(stop_signal)


def main() -> None:
    """Entry point for ``python worker.py``: settings from the environment."""
    from cli.main import run

    run(["worker"])


if __name__ == "__main__":
    main()
