"""The configuration file: where ``ONCEFLOW_CONFIG`` points, parsed as TOML."""

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onceflow.settings._invalid import InvalidSettings

CONFIG_FILE_VARIABLE = "ONCEFLOW_CONFIG"
"""Environment variable naming the configuration file (``onceflow --config`` sets it)."""


@dataclass(frozen=True)
class ConfigFile:
    """The configuration file named by ``ONCEFLOW_CONFIG``, parsed."""

    path: Path
    """The file, as ``ONCEFLOW_CONFIG`` names it."""
    document: Mapping[str, Any]
    """Its parsed TOML."""

    def table(self, name: str) -> Mapping[str, Any] | None:
        """The table ``name`` (dotted, e.g. ``tools.payments``), or None if absent."""
        node: Any = self.document
        for part in name.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node if isinstance(node, dict) else None


def config_file_path() -> Path | None:
    """The file ``ONCEFLOW_CONFIG`` names, or None when it is not set (no implicit lookup)."""
    named = os.environ.get(CONFIG_FILE_VARIABLE, "").strip()
    return Path(named) if named else None


def read_config_file() -> ConfigFile | None:
    """Parse the configuration file; a missing, unreadable or broken one is ``InvalidSettings``."""
    path = config_file_path()
    if path is None:
        return None
    fix = f"fix: point {CONFIG_FILE_VARIABLE} (or --config) at a TOML file, or unset it"
    try:
        with path.open("rb") as stream:
            document = tomllib.load(stream)
    except FileNotFoundError:
        raise InvalidSettings(f"config file {path} does not exist; {fix}") from None
    except tomllib.TOMLDecodeError as broken:
        # tomllib's messages name a position and sometimes a key, never a value.
        raise InvalidSettings(
            f"config file {path} is not valid TOML: {broken}; fix: correct the file there"
        ) from None
    except UnicodeDecodeError as undecodable:
        raise InvalidSettings(
            f"config file {path} is not UTF-8 text (byte {undecodable.start}); "
            "fix: save it as UTF-8"
        ) from None
    except OSError as unreadable:
        raise InvalidSettings(
            f"config file {path} cannot be read: {unreadable.strerror or unreadable}; {fix}"
        ) from None
    return ConfigFile(path, document)
