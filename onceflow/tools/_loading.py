"""Finds the tools named in configuration and registers them with the catalogue.

Each entry of ``ONCEFLOW_TOOLS`` (or ``tools = [...]`` in the settings file) is either an
entry point name in the ``onceflow.tools`` group (what an installed package declares) or
an import path ``package.module:ATTRIBUTE``. The target is a ``Tool``, a list of them, or
a function without arguments returning either. The worker, the gateway and the MCP server
load the same list, so all agree on what exists.
"""

import importlib
from collections.abc import Iterable
from importlib.metadata import entry_points
from typing import Any

from onceflow.tools._catalogue import CATALOGUE, Catalogue
from onceflow.tools._checks import ToolRegistrationError, refuse
from onceflow.tools._tool import Tool, tool_problems

ENTRY_POINT_GROUP = "onceflow.tools"
"""The entry point group a package declares its tools in."""


def load_tools(specs: Iterable[str]) -> tuple[Tool, ...]:
    """The tools named by ``specs``, in order; raises ``ToolRegistrationError`` with a fix."""
    tools: list[Tool] = []
    for spec in specs:
        target = _resolve(spec)
        if callable(target) and not isinstance(target, Tool):
            target = target()
        found = list(target) if isinstance(target, list | tuple) else [target]
        for tool in found:
            problems = tool_problems(tool)
            if problems:
                raise refuse(getattr(getattr(tool, "contract", None), "name", spec), problems)
            tools.append(tool)
    return tuple(tools)


def register_tools(tools: Iterable[Tool], catalogue: Catalogue = CATALOGUE) -> None:
    """Add ``tools``' contracts to ``catalogue``; a tool already registered is skipped.

    Registering the same ``Tool`` twice (a worker and a gateway in one process) is
    harmless; a different tool under a taken name is refused.
    """
    for tool in tools:
        contract = tool.registered_contract
        if contract.name in catalogue and catalogue.get(contract.name) == contract:
            continue
        catalogue.register(contract)


def load_configured_tools(
    specs: Iterable[str], catalogue: Catalogue = CATALOGUE
) -> tuple[Tool, ...]:
    """Load the configured tools and register them: what every process does at start-up."""
    tools = load_tools(specs)
    register_tools(tools, catalogue)
    return tools


def _resolve(spec: str) -> Any:
    if ":" in spec:
        return _import(spec)
    matches = entry_points(group=ENTRY_POINT_GROUP, name=spec)
    if not matches:
        installed = sorted(point.name for point in entry_points(group=ENTRY_POINT_GROUP))
        raise ToolRegistrationError(
            f"ONCEFLOW_TOOLS names {spec!r}, but no installed package declares an "
            f"{ENTRY_POINT_GROUP!r} entry point of that name (installed: "
            f"{', '.join(installed) or 'none'}); fix: install the package that provides it, "
            "or use an import path package.module:ATTRIBUTE"
        )
    try:
        return next(iter(matches)).load()
    except Exception as error:
        raise ToolRegistrationError(
            f"the {ENTRY_POINT_GROUP!r} entry point {spec!r} failed to load "
            f"({type(error).__name__}: {error}); fix: check that its package is installed "
            "in this environment and imports cleanly"
        ) from None


def _import(spec: str) -> Any:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ToolRegistrationError(
            f"ONCEFLOW_TOOLS entry {spec!r} is not an import path; fix: write it as "
            "package.module:ATTRIBUTE"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ToolRegistrationError(
            f"ONCEFLOW_TOOLS entry {spec!r}: cannot import {module_name!r} ({error}); fix: "
            "install the package or put it on PYTHONPATH"
        ) from None
    except Exception as error:  # the user's module is broken: say where, not a traceback
        raise ToolRegistrationError(
            f"ONCEFLOW_TOOLS entry {spec!r}: importing {module_name!r} failed "
            f"({type(error).__name__}: {error}); fix: run `python -c 'import {module_name}'` "
            "and correct the module"
        ) from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ToolRegistrationError(
            f"ONCEFLOW_TOOLS entry {spec!r}: module {module_name!r} has no {attribute!r}; "
            "fix: name the variable that holds the Tool"
        ) from None
