"""``OnceflowPlugin`` is the one way onceflow builds a client, a worker and a replayer.

The live tests read each one's active configuration: what it runs with comes from the
plugin, and nothing was passed beside it. The source test keeps it so: no product module
hands Temporal a converter, interceptors, a runner, workflows or activities itself, and
every test replayer is built with the plugin.
"""

import ast
import warnings
from pathlib import Path
from typing import Any

from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from onceflow.encryption import PayloadEncryptionCodec
from onceflow.plugin import (
    STRICT_SANDBOX,
    TASK_WORKFLOWS,
    ContextFreeRunner,
    OnceflowPlugin,
)
from onceflow.settings import OnceflowSettings
from onceflow.storage import build_pool
from onceflow.task_api import connect_temporal
from onceflow.telemetry import AttemptAnnotations
from onceflow.worker import build_worker
from tests.conftest import repo_root
from tests.encryption.conftest import encryption_settings
from tests.tool_configuration import builtin

HANDED_BY_THE_PLUGIN = {
    "Client": {"data_converter", "interceptors"},
    "Worker": {"workflows", "activities", "workflow_runner", "interceptors"},
    "Replayer": {"data_converter", "workflow_runner", "interceptors"},
}
"""The keywords only ``OnceflowPlugin`` gives each Temporal class (or ``Client.connect``)."""


def kinds(interceptors: Any) -> list[type]:
    return [type(interceptor) for interceptor in interceptors]


async def test_connect_temporal_builds_its_client_with_the_plugin(dev_server: Any) -> None:
    address = dev_server.client.service_client.config.target_host
    client = await connect_temporal(address=address, encryption=encryption_settings())
    assert kinds(client.config()["plugins"]) == [OnceflowPlugin]
    assert client.config()["interceptors"] == []
    active = client.config(active_config=True)
    assert isinstance(active["data_converter"].payload_codec, PayloadEncryptionCodec)
    assert kinds(active["interceptors"]) == [TracingInterceptor]
    clear = await connect_temporal(address=address)
    assert clear.config(active_config=True)["data_converter"] is pydantic_data_converter


async def test_build_worker_builds_its_worker_with_the_plugin_on_any_client(
    postgres_url: str, task_queue: str, dev_server: Any
) -> None:
    address = dev_server.client.service_client.config.target_host
    settings = OnceflowSettings(task_queue=task_queue, shutdown_grace_seconds=1)
    for client in (await connect_temporal(address=address), dev_server.client):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            async with (
                build_pool(postgres_url, max_size=1) as pool,
                build_worker(client, pool, settings, tools=builtin()) as worker,
            ):
                given = worker.config()
                active = worker.config(active_config=True)
        assert (given["workflows"], given["activities"], given["interceptors"]) == ([], [], [])
        assert [type(p) for p in given["plugins"]] == [OnceflowPlugin]
        assert active["workflows"] == list(TASK_WORKFLOWS)
        names = {getattr(activity, "__name__", "") for activity in active["activities"]}
        assert {"pin_task_policy", "record_task_outcome", "run_audit"} <= names
        assert isinstance(active["workflow_runner"], ContextFreeRunner)
        # Tracing comes with the client, as the SDK gives a worker its client's interceptors.
        assert kinds(active["interceptors"]) == [AttemptAnnotations]


def test_a_replayer_built_with_the_plugin_runs_what_the_worker_runs() -> None:
    active = Replayer(workflows=[], plugins=[OnceflowPlugin(strict_sandbox=True)]).config(
        active_config=True
    )
    assert active["workflows"] == list(TASK_WORKFLOWS)
    assert active["data_converter"] is pydantic_data_converter
    assert kinds(active["interceptors"]) == [TracingInterceptor, AttemptAnnotations]
    runner = active["workflow_runner"]
    assert isinstance(runner, ContextFreeRunner)
    assert runner._inner._inner is STRICT_SANDBOX  # type: ignore[attr-defined]


def calls(path: Path) -> list[tuple[str, set[str], int]]:
    """Each call of a Temporal class (or ``Client.connect``) in ``path``: its name, its
    keywords and its line."""
    text = path.read_text()
    if not any(f"{name}(" in text or f"{name}.connect(" in text for name in HANDED_BY_THE_PLUGIN):
        return []  # parsing only the files that can hold one keeps the scan quick
    found = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = (
            func.id
            if isinstance(func, ast.Name)
            else "Client"
            if isinstance(func, ast.Attribute)
            and func.attr == "connect"
            and isinstance(func.value, ast.Name)
            and func.value.id == "Client"
            else None
        )
        if name in HANDED_BY_THE_PLUGIN:
            keywords = {keyword.arg for keyword in node.keywords if keyword.arg}
            found.append((name, keywords, node.lineno))
    return found


def test_no_product_module_builds_a_client_or_worker_beside_the_plugin() -> None:
    beside = []
    for folder in ("onceflow", "devstack/onceflow_devstack", "client/onceflow_client"):
        for path in sorted((repo_root() / folder).rglob("*.py")):
            for name, keywords, line in calls(path):
                if keywords & HANDED_BY_THE_PLUGIN[name]:
                    where = path.relative_to(repo_root())
                    beside.append(f"{where}:{line} {name}({sorted(keywords)})")
    assert beside == []


CALLERS_OWN_REPLAYERS = {"tests/nexus/caller_process.py"}
"""Replays of a Nexus caller's own workflows (an agent's, in its client-only virtualenv):
they run with the caller's plugins, never onceflow's."""


def test_every_test_replayer_is_built_with_the_plugin() -> None:
    without = []
    for path in sorted((repo_root() / "tests").rglob("*.py")):
        if str(path.relative_to(repo_root())) in CALLERS_OWN_REPLAYERS:
            continue
        for name, keywords, line in calls(path):
            if name == "Replayer" and (
                "plugins" not in keywords or keywords & HANDED_BY_THE_PLUGIN[name]
            ):
                without.append(f"{path.relative_to(repo_root())}:{line}")
    assert without == []
