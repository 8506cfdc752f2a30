"""The onceflow worker process: runs task workflows and tool activities on one task queue.

Run as ``onceflow worker`` (the CLI calls ``serve_worker``; this module imports no CLI);
run several on one task queue to scale out. SIGTERM or SIGINT shuts it down gracefully:
running activities get ``ONCEFLOW_SHUTDOWN_GRACE`` to finish before the process exits.
"""

import asyncio
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import timedelta
from typing import Any

from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client
from temporalio.worker import Worker

from onceflow.activities import (
    IdempotencyRecordActivities,
    configured_families,
    startup_problems,
)
from onceflow.configuration import OnceflowConfiguration
from onceflow.gateway import PrincipalStore
from onceflow.nexus import NexusPrincipal, OnceflowToolsHandler, PrincipalLookup
from onceflow.plugin import OnceflowPlugin
from onceflow.settings import InvalidSettings, OnceflowSettings
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient, connect_temporal
from onceflow.telemetry import metrics_enabled, watch_parked_tasks
from onceflow.tools import Auditor, ClientOpener, Tool
from onceflow.tools.providers import watch_provider_health
from onceflow.tools.worker import (
    AuditActivities,
    Catalogue,
    PolicyPinning,
    open_tool_client,
    refuse_retrying_client,
    register_tools,
    tool_activities,
)

STICKY_TIMEOUT = timedelta(seconds=10)
"""How long a task's next workflow task or query waits on the queue of the worker that
cached it before any worker takes it: Temporal's default. Each expiry is recorded in the
task's history (a workflow task timed out); the gateway's status deadline waits it out."""


def task_queue_rate_limit(setting: float | None) -> float | None:
    """The activity dispatch rate the worker asks Temporal to hold its task queue to:
    ``setting`` (``task_queue_activities_per_second``), 0 or unset meaning none.

    Opt-in, not derived from the providers' declared rates: a limit holds the whole
    queue (every tool's attempts, look-ups and record activities share it) and, set,
    stops Core's eager activity starts, which would bypass it; so every attempt then
    goes through matching (a round trip more) and may reach any worker of the queue,
    one without the tool included. An operator sets it to the provider's rate
    (``Provider.requests_per_second``: Stripe's 100/s) where the fleet can reach it.
    Per-provider queues would hold each provider to its own rate alone, but moving a
    tool's activities to another queue changes what a task in flight schedules (its
    replay), so one queue it stays.
    """
    return setting or None


@asynccontextmanager
async def build_worker(
    client: Client,
    pool: AsyncConnectionPool,
    settings: OnceflowSettings,
    *,
    tools: Iterable[Tool],
    clients: Mapping[str, Any] | None = None,
    auditors: Mapping[str, Auditor] | None = None,
) -> AsyncIterator[Worker]:
    """The one composition point: a running worker with ``OnceflowPlugin`` carrying the
    workflows, the workflow runner, every tool's activities (built-in and custom alike:
    ``open_tool_client`` + ``tool_activities``) and the boundary's record activities.
    Leaving the block shuts it down: no new work is taken and running activities get the
    shutdown grace, so their completions are kept.

    The tools are registered with the catalogue first: a call of an open task is
    checked against their contracts there. (A task started before 0.3.0 without
    policies pins them from there with ``pin_task_policy``, and keeps them for its whole
    life whatever worker runs it later.) Each tool's client is opened
    once for the worker's lifetime; tools sharing one ``open_client`` (one family's)
    share the client it opened. Tracing comes with ``client`` (``connect_temporal`` puts
    Temporal's interceptor on it, and a worker inherits its client's);
    the plugin's ``AttemptAnnotations`` adds onceflow's fields to each attempt's span and logs one
    line per attempt.

    Args:
        client: The Temporal client.
        pool: The database pool every tool and record activity uses.
        settings: Task queue, shutdown grace, cache size, the task queue's activity
            rate limit (``task_queue_rate_limit``) and the principal its Nexus service
            acts as (``nexus_service``).
        tools: The tools to serve (in production, those of
            ``configured_families(configuration)``).
        clients: Clients by tool name, used instead of opening that tool's own (tests
            inject a fault-injecting provider this way); checked for retries the same.
            Default: none.
        auditors: The tool families' auditors by family, which a scheduled
            ``AuditWorkflow`` runs here. Default: none (a scheduled audit fails, saying so).

    Raises:
        ToolRegistrationError: A tool is unsafe, takes a name already registered with
            another contract, or its client retries on its own.
    """
    tools = tuple(tools)
    register_tools(tools)
    injected = dict(clients or {})
    async with AsyncExitStack() as opened:
        by_opener: dict[ClientOpener, Any] = {}
        activities: list[Callable[..., Any]] = []
        for tool in tools:
            if tool.name in injected:
                tool_client = injected[tool.name]
                refuse_retrying_client(tool.name, tool_client)
            elif tool.open_client is not None and tool.open_client in by_opener:
                tool_client = by_opener[tool.open_client]
            else:
                tool_client = await open_tool_client(tool, opened)
                if tool.open_client is not None:
                    by_opener[tool.open_client] = tool_client
            activities += tool_activities(
                tool, pool, tool_client, provider_budgets=settings.provider_budgets
            )
        records = IdempotencyRecordActivities(
            pool, TaskClient(client, task_queue=settings.task_queue)
        )
        plugin = OnceflowPlugin(
            activities=[
                *activities,
                AuditActivities(auditors or {}).run_audit,
                records.record_task_outcome,
                records.prune_idempotency_records,
                # Pins the policies of a task started without them before 0.3.0 (local
                # activity; retired with patch policies-carried-no-pin).
                PolicyPinning().pin_task_policy,
            ]
        )
        nexus = nexus_service(client, pool, settings, tools)
        with warnings.catch_warnings():
            # The SDK warns that a client's plugin (``connect_temporal``'s) may configure a
            # worker twice; onceflow's leaves a worker to the worker's own (OnceflowPlugin).
            warnings.filterwarnings("ignore", "The same plugin type", UserWarning)
            worker = Worker(
                client,
                task_queue=settings.task_queue,
                plugins=[plugin],
                nexus_service_handlers=[nexus] if nexus is not None else [],
                graceful_shutdown_timeout=timedelta(seconds=settings.shutdown_grace_seconds),
                max_cached_workflows=settings.max_cached_tasks,
                sticky_queue_schedule_to_start_timeout=STICKY_TIMEOUT,
                # Enforced by the server for the whole fleet (sent with every activity poll);
                # with it set, Core also stops eager activity starts, which would bypass it.
                max_task_queue_activities_per_second=task_queue_rate_limit(
                    settings.task_queue_activities_per_second
                ),
            )
        async with worker:
            yield worker


def nexus_service(
    client: Client, pool: AsyncConnectionPool, settings: OnceflowSettings, tools: Iterable[Tool]
) -> OnceflowToolsHandler | None:
    """The ``OnceflowTools`` Nexus service this worker serves on its task queue, when
    ``settings.nexus_principal`` names the principal its callers act as: its tasks carry
    the served tools' policies, as the gateway's do.

    Raises:
        InvalidSettings: ``nexus_principal`` is not ``TENANT/NAME``.
    """
    if settings.nexus_principal is None:
        return None
    try:
        principal = NexusPrincipal.parse(settings.nexus_principal)
    except ValueError as error:
        raise InvalidSettings(f"ONCEFLOW_NEXUS_PRINCIPAL: {error}") from None
    catalogue = Catalogue(tuple(tool.registered_contract for tool in tools))
    return OnceflowToolsHandler(
        tasks=TaskClient(client, task_queue=settings.task_queue, catalogue=catalogue),
        catalogue=catalogue,
        principal=PrincipalLookup(PrincipalStore(pool), principal),
    )


async def serve_worker(
    configuration: OnceflowConfiguration,
    *,
    database_url: str,
    stop: asyncio.Event,
    temporal_address: str | None = None,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Poll for work until ``stop`` is set, then drain within the shutdown grace.

    Refuses to start (``InvalidSettings``, one line per problem) while a served tool lacks
    a service its family declares it needs (``startup_problems``): it never joins a dev
    stack it finds.

    Serves the tools of ``configured_families(configuration)``: onceflow's own families,
    each built from its sections, and the custom ones of ``[onceflow] tools``, loaded the
    same way and registered before anything connects (an unsafe
    tool stops the start-up with ``ToolRegistrationError``) and their clients opened for
    the worker's lifetime. Payloads are encrypted when ``[payload_encryption]`` holds
    keys. Relays run apart (``onceflow relay``). When the process
    exports metrics, the worker also publishes the parked-task gauges. It runs the
    scheduled audits (``AuditWorkflow``) of every family that offers one and whose
    provider its settings name (payments: ``STRIPE_API_KEY``), each with a client of its
    own.
    """
    settings = configuration.onceflow
    families = configured_families(configuration)
    missing = startup_problems(configuration, families)
    if missing:
        raise InvalidSettings(*missing)
    tools = tuple(tool for family in families for tool in family.tools)
    register_tools(tools)
    client = await connect_temporal(
        address=temporal_address, encryption=configuration.payload_encryption
    )
    async with (
        watch_parked_tasks(client, every=timedelta(seconds=settings.parked_scan_seconds)),
        build_pool(database_url, max_size=settings.db_pool_max_size) as pool,
        AsyncExitStack() as audits,
    ):
        # The families' scheduled audits, each reading its provider with a client of its own.
        auditors = {
            family.name: auditor
            for family in families
            if family.open_auditor is not None
            and (auditor := await audits.enter_async_context(family.open_auditor(pool)))
        }
        providers = {t.registered_contract.budget_provider for t in tools} - {None}
        if metrics_enabled() and settings.provider_budgets:
            # The providers' states as gauges, read as often as the parked tasks are counted.
            await audits.enter_async_context(
                watch_provider_health(
                    pool,
                    (p for p in providers if p is not None),
                    every=timedelta(seconds=settings.parked_scan_seconds),
                )
            )
        async with build_worker(client, pool, settings, tools=tools, auditors=auditors):
            if on_ready is not None:
                on_ready()
            await stop.wait()
