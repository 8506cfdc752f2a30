"""Composes one boundary process: its database pool, Temporal client and service."""

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta

from onceflow.encryption import PayloadEncryptionSettings
from onceflow.gateway._principal_cache import principal_cache
from onceflow.gateway._principals import PrincipalStore
from onceflow.gateway._pruning import ensure_prune_schedule
from onceflow.gateway._service import BoundaryService
from onceflow.gateway._settings import GatewaySettings, check_retention
from onceflow.idempotency import IdempotencyStore
from onceflow.settings import OnceflowSettings, ProcessSettings
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient, connect_temporal
from onceflow.tools.worker import load_configured_tools


@asynccontextmanager
async def open_boundary(
    settings: OnceflowSettings,
    gateway_settings: GatewaySettings,
    *,
    database_url: str,
    temporal_address: str | None = None,
    after_claim: Callable[[], Awaitable[None]] | None = None,
    encryption: PayloadEncryptionSettings | None = None,
) -> AsyncIterator[BoundaryService]:
    """The boundary service with its clients, for the duration of the block.

    Refuses to start (``RetentionTooShort``) when results would be pruned inside the
    retry window, or (``ToolRegistrationError``) when a configured tool is unsafe, and
    makes sure the prune schedule exists. Its Temporal client encrypts payloads when
    ``encryption`` holds keys (``onceflow_data_converter``).
    """
    check_retention(gateway_settings)
    # The configured custom tools join the shared catalogue the boundary validates against.
    load_configured_tools(settings.tools, ProcessSettings())
    client = await connect_temporal(address=temporal_address, encryption=encryption)
    await ensure_prune_schedule(
        client,
        task_queue=settings.task_queue,
        every=timedelta(seconds=gateway_settings.prune_interval_seconds),
    )
    async with (
        # Every statement the boundary runs is its own transaction, or inside an
        # explicit one: no connection needs switching out of implicit transactions.
        build_pool(
            database_url, max_size=gateway_settings.db_pool_max_size, autocommit=True
        ) as pool,
        principal_cache(database_url) as cache,
    ):
        yield BoundaryService(
            principals=PrincipalStore(pool, cache=cache),
            records=IdempotencyStore(pool),
            tasks=TaskClient(client, task_queue=settings.task_queue),
            settings=gateway_settings,
            after_claim=after_claim,
        )
