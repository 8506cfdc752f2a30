"""Finds the tools named in configuration and registers them with the catalogue.

Each entry of ``ONCEFLOW_TOOLS`` (or ``tools = [...]`` in the settings file) is either an
entry point name in the ``onceflow.tools`` group (what an installed package declares) or
an import path ``package.module:ATTRIBUTE``. The target is a ``ToolFamily``, a ``Tool``, a
list of tools, or a function returning one of those. onceflow's own families go through
the same ``load_families`` (``onceflow.activities``). The worker, the gateway and the MCP
server load the same list, so all agree on what exists.
"""

import importlib
import inspect
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from typing import Any

from onceflow.tools._catalogue import CATALOGUE, Catalogue
from onceflow.tools._checks import ToolRegistrationError, refuse, refuse_family
from onceflow.tools._family import ToolFamily, family_problems, remember_family
from onceflow.tools._tool import Tool, tool_problems

ENTRY_POINT_GROUP = "onceflow.tools"
"""The entry point group a package declares its tools in."""


def load_families(specs: Iterable[str], settings: object) -> tuple[ToolFamily, ...]:
    """The tool families named by ``specs``, in order, each checked and remembered for
    the process (its redactions and client checks hold from now on).

    A spec's target is a ``ToolFamily``, a ``Tool``, a list of tools (a family named
    after the spec), or a function returning one of those. A function taking one
    argument is given ``settings``, the settings source of the entry point that loads it
    (its ``onceflow.OnceflowConfiguration``, or ``onceflow.settings.ProcessSettings()``),
    to read its sections from: onceflow's own families are loaded this way. The tool API
    passes it on unread: how a process reads its configuration is its entry point's
    business.

    Raises:
        ToolRegistrationError: A target cannot be loaded, or a tool or the family is
            unsafe, with the fix.
    """
    families: list[ToolFamily] = []
    for spec in specs:
        target = _resolve(spec)
        if callable(target) and not isinstance(target, Tool | ToolFamily):
            target = _build(target, settings)
        family = target if isinstance(target, ToolFamily) else _family_of(spec, target)
        for tool in family.tools:
            problems = tool_problems(tool)
            if problems:
                raise refuse(getattr(getattr(tool, "contract", None), "name", spec), problems)
        problems = family_problems(family)
        if problems:
            raise refuse_family(family.name, problems)
        remember_family(family)
        families.append(family)
    return tuple(families)


def load_tools(specs: Iterable[str], settings: object) -> tuple[Tool, ...]:
    """The tools of the families named by ``specs`` (``load_families``), in order; raises
    ``ToolRegistrationError`` with a fix."""
    return tuple(tool for family in load_families(specs, settings) for tool in family.tools)


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
    specs: Iterable[str], settings: object, catalogue: Catalogue = CATALOGUE
) -> tuple[Tool, ...]:
    """Load the configured tools (a family function is given ``settings``) and register
    them: what every process does at start-up."""
    tools = load_tools(specs, settings)
    register_tools(tools, catalogue)
    return tools


def _build(factory: Callable[..., Any], settings: object) -> Any:
    """Call a family's function, with the settings source when it takes an argument."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: call it as it is
        return factory()
    wanted = [
        parameter
        for parameter in parameters
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
        and parameter.default is parameter.empty
    ]
    if wanted:
        return factory(settings)
    return factory()


def _family_of(spec: str, target: Any) -> ToolFamily:
    """A family of the tools a spec names directly (a ``Tool`` or a list of them)."""
    found = tuple(target) if isinstance(target, list | tuple) else (target,)
    return ToolFamily(name=spec, tools=found)


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
            "fix: name the variable that holds the Tool or ToolFamily"
        ) from None
