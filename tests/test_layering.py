"""The house's layers, read from the source of the three distributions.

A package's private modules (``_name``) are its own: another package imports what the
package's ``__init__`` exports, so a change inside one package cannot break another
silently. And no two parts of ``onceflow`` import each other, directly or around a
circle (the worker is a leaf the CLI calls, never the other way).
"""

import ast
from collections.abc import Iterator
from pathlib import Path

from .conftest import repo_root

DISTRIBUTIONS = {
    "onceflow": Path("onceflow"),
    "onceflow_devstack": Path("devstack/onceflow_devstack"),
    "onceflow_client": Path("client/onceflow_client"),
}


def modules() -> Iterator[tuple[list[str], Path]]:
    """Each module's package (for a package's ``__init__``, the package itself)."""
    for top, folder in DISTRIBUTIONS.items():
        for path in sorted((repo_root() / folder).rglob("*.py")):
            parts = [top, *path.relative_to(repo_root() / folder).with_suffix("").parts]
            yield parts[:-1], path


def imported(path: Path) -> Iterator[str]:
    """Every absolute import in the file, at any depth (function-level ones too), with
    each name a ``from`` import takes."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def private_owner(name: str) -> list[str] | None:
    """The package a private module or name belongs to; None for a public name."""
    components = name.split(".")
    for index, component in enumerate(components):
        if component.startswith("_") and not component.startswith("__"):
            return components[:index]
    return None


def test_no_module_imports_another_packages_private_module() -> None:
    crossings = set()
    for package, path in modules():
        for name in imported(path):
            owner = private_owner(name)
            if name.split(".")[0] in DISTRIBUTIONS and owner is not None:
                if package[: len(owner)] != owner:
                    crossings.add(f"{path.relative_to(repo_root())} imports {name}")
    assert sorted(crossings) == []


def test_no_two_parts_of_onceflow_import_each_other_around_a_circle() -> None:
    imports: dict[str, set[str]] = {}
    for package, path in modules():
        if package[0] != "onceflow":
            continue
        own = path.relative_to(repo_root() / "onceflow").with_suffix("").parts[0]
        for name in imported(path):
            components = name.split(".")
            if components[0] == "onceflow" and len(components) > 1 and components[1] != own:
                imports.setdefault(own, set()).add(components[1])
    circles = [part for part in imports if reaches(imports, part, part)]
    assert circles == [], f"parts on an import circle: {sorted(circles)}"


def reaches(imports: dict[str, set[str]], start: str, goal: str) -> bool:
    seen: set[str] = set()
    frontier = list(imports.get(start, ()))
    while frontier:
        part = frontier.pop()
        if part == goal:
            return True
        if part not in seen:
            seen.add(part)
            frontier += imports.get(part, ())
    return False


def test_the_tool_api_reads_no_process_settings() -> None:
    """A tool author's package must not depend on how a process reads its environment:
    a family gets its settings source from the entry point that loads it."""
    settings_imports = {
        f"{path.relative_to(repo_root())} imports {name}"
        for package, path in modules()
        if package[:2] == ["onceflow", "tools"]
        for name in imported(path)
        if name == "onceflow.settings" or name.startswith("onceflow.settings.")
    }
    assert sorted(settings_imports) == []
