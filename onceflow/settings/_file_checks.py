"""Typos never pass: unknown tables and keys of the configuration file, with the nearest
known name as the fix."""

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic_settings import BaseSettings

from onceflow.settings._base import TABLES
from onceflow.settings._file import ConfigFile


def document_problems(config: ConfigFile) -> list[str]:
    """Unknown tables, and unknown keys of every known table, in the whole file."""
    problems: list[str] = []
    _walk(config, config.document, "", problems)
    return problems


def _walk(config: ConfigFile, node: Mapping[str, Any], prefix: str, problems: list[str]) -> None:
    for key, value in node.items():
        name = f"{prefix}.{key}" if prefix else key
        if name in TABLES:
            if isinstance(value, dict):
                problems.extend(table_problems(config, name))
            else:
                problems.append(
                    f"[{name}] in {config.path} is not a table; fix: write it as a [{name}] section"
                )
        elif isinstance(value, dict) and any(table.startswith(f"{name}.") for table in TABLES):
            _walk(config, value, name, problems)
        elif isinstance(value, dict):
            problems.append(
                f"unknown table [{name}] in {config.path}; fix: "
                + _rename_or_remove(name, sorted(TABLES), "tables", brackets=True)
            )
        elif prefix:
            problems.append(
                f"unknown setting [{prefix}] {key} in {config.path}; fix: "
                + _rename_or_remove(name, sorted(TABLES), "tables", brackets=True)
            )
        else:
            homes = sorted(table for table, classes in TABLES.items() if _knows(classes, key))
            problems.append(
                f"setting {key} in {config.path} is outside any table; fix: "
                + (
                    f"move it into [{homes[0]}]"
                    if len(homes) == 1
                    else "move it into its table, or remove it"
                )
            )


def table_problems(config: ConfigFile, table: str) -> list[str]:
    """Keys of ``table`` that no class reading it knows (nested known tables excepted)."""
    values = config.table(table) or {}
    classes = TABLES.get(table, [])
    known = sorted({name for settings_class in classes for name in settings_class.model_fields})
    problems: list[str] = []
    for key, value in values.items():
        if key in known:
            continue
        nested = f"{table}.{key}"
        if isinstance(value, dict) and any(
            other == nested or other.startswith(f"{nested}.") for other in TABLES
        ):
            continue  # a table of its own, checked as such
        problems.append(
            f"unknown setting [{table}] {key} in {config.path}; fix: "
            + _rename_or_remove(key, known, f"settings of [{table}]", brackets=False)
        )
    return problems


def _knows(classes: Iterable[type[BaseSettings]], key: str) -> bool:
    return any(key in settings_class.model_fields for settings_class in classes)


def _rename_or_remove(name: str, known: list[str], what: str, *, brackets: bool) -> str:
    def shown(candidate: str) -> str:
        return f"[{candidate}]" if brackets else candidate

    nearest = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if nearest:
        return f"did you mean {shown(nearest[0])}? rename it, or remove it"
    return f"remove it (known {what}: {', '.join(shown(candidate) for candidate in known)})"
