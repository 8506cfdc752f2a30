"""Every SDK internal onceflow touches, named, so that an SDK upgrade fails with the list.

``PRIVATE_SDK_APIS`` are the private names (``_name``) and internal modules
(``temporalio.bridge``, the Core protocol) the code imports or reads; the source scan keeps
the list complete, and each must still resolve in the installed SDK. The runner wrappers
(``onceflow.plugin``) also depend on surfaces an SDK can change without renaming anything:
the methods a ``WorkflowRunner`` and a ``WorkflowInstance`` have (a wrapper that does not
forward a new one silently answers with the default) and the activation fields they read.
Core's id for a legacy query (``LEGACY_QUERY_ID``) cannot be read from Python; the
reproduction in ``tests/workflows/test_replay_exact.py`` fails when it changes.
"""

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

from temporalio.bridge.proto.workflow_activation import QueryWorkflow, WorkflowActivation
from temporalio.bridge.proto.workflow_completion import (
    Failure,
    WorkflowActivationCompletion,
)
from temporalio.worker import WorkflowInstance, WorkflowRunner

from .conftest import repo_root
from .test_layering import DISTRIBUTIONS

PRIVATE_SDK_APIS = {
    "temporalio.workflow._Definition": "the type of the workflow definition a runner's "
    "prepare_workflow gets (onceflow.plugin's runner wrappers)",
    "temporalio.bridge.proto.workflow_activation.WorkflowActivation": "what Core asks a "
    "workflow instance to apply (DeliveredEventsRunner reads its jobs and stamps)",
    "temporalio.bridge.proto.workflow_completion.WorkflowActivationCompletion": "what a "
    "workflow instance answers Core (DeliveredEventsRunner fails a query with one)",
}
"""Each private or internal SDK name onceflow uses, with what uses it."""

RUNNER_METHODS = {"create_instance", "prepare_workflow", "set_worker_level_failure_exception_types"}
INSTANCE_METHODS = {
    "activate",
    "get_external_store_context",
    "get_info",
    "get_serialization_context",
    "get_thread_id",
}
"""The methods the runner wrappers forward: every method the SDK's base classes have."""

ACTIVATION_FIELDS = {
    WorkflowActivation: {"jobs", "history_length", "timestamp", "run_id"},
    QueryWorkflow: {"query_id"},
    WorkflowActivationCompletion: {"run_id", "failed"},
    Failure: {"failure"},
}
"""The Core protocol fields ``DeliveredEventsRunner`` reads or writes."""

INTERNAL_PACKAGES = ("temporalio.bridge",)
"""SDK packages that are internal although their names are not private."""


def is_private(component: str) -> bool:
    return component.startswith("_") and not component.startswith("__")


def internal(dotted: str) -> str | None:
    """``dotted`` cut after its first private component, or whole when it lies in an
    internal package; None for a public SDK name."""
    components = dotted.split(".")
    for index, component in enumerate(components):
        if is_private(component):
            return ".".join(components[: index + 1])
    return dotted if dotted.startswith(INTERNAL_PACKAGES) else None


def dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def sdk_names(path: Path) -> Iterator[str]:
    """Every SDK name the module imports, and every attribute chain it reads from an SDK
    module it imported, spelled from ``temporalio``."""
    text = path.read_text()
    if "temporalio" not in text:
        return
    tree = ast.parse(text)
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "temporalio":
                for alias in node.names:
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    yield f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "temporalio":
                    # ``import temporalio.x`` binds ``temporalio``; ``as y`` binds y to x.
                    bound[alias.asname or "temporalio"] = (
                        alias.name if alias.asname else "temporalio"
                    )
                    yield alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (chain := dotted(node)) is not None:
            head, _, rest = chain.partition(".")
            if head in bound:
                yield f"{bound[head]}.{rest}"


def test_the_private_sdk_apis_onceflow_touches_are_the_listed_ones() -> None:
    touched: dict[str, set[str]] = {}
    for folder in DISTRIBUTIONS.values():
        for path in sorted((repo_root() / folder).rglob("*.py")):
            for name in sdk_names(path):
                if (cut := internal(name)) is not None:
                    touched.setdefault(cut, set()).add(str(path.relative_to(repo_root())))
    in_use = {name: sorted(paths) for name, paths in touched.items()}
    assert sorted(in_use) == sorted(PRIVATE_SDK_APIS), (
        f"private SDK APIs in use: {in_use}; listed: {sorted(PRIVATE_SDK_APIS)}"
    )


def test_every_listed_private_sdk_api_resolves_in_the_installed_sdk() -> None:
    missing = []
    for name in PRIVATE_SDK_APIS:
        module, _, attribute = name.rpartition(".")
        try:
            getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as error:
            missing.append(f"{name} ({PRIVATE_SDK_APIS[name]}): {error}")
    assert missing == [], f"the SDK changed what onceflow relies on: {missing}"


def methods(base: type) -> set[str]:
    return {name for name, value in vars(base).items() if callable(value) and not is_private(name)}


def test_the_runner_wrappers_forward_every_method_the_sdk_defines() -> None:
    assert methods(WorkflowRunner) - {"__init__"} == RUNNER_METHODS, "forward the new ones"
    assert methods(WorkflowInstance) - {"__init__"} == INSTANCE_METHODS, "forward the new ones"


def test_the_core_fields_the_runner_reads_exist() -> None:
    missing = [
        f"{message.__name__}.{field}"
        for message, fields in ACTIVATION_FIELDS.items()
        for field in sorted(fields)
        if field not in message.DESCRIPTOR.fields_by_name
    ]
    assert missing == [], f"Core's protocol changed under DeliveredEventsRunner: {missing}"
