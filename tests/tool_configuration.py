"""The configuration and built-in tools a test process uses, as an entry point would build them.

``configuration(**sections)`` is every section at its default (read from the test
process's environment, which sets none of them), with the given sections replaced; the
built-in tools of it are what a worker, a gateway or the MCP server registers at start-up.
"""

from typing import Any

from onceflow.activities import builtin_tools
from onceflow.configuration import OnceflowConfiguration
from onceflow.settings import FileBackedSettings
from onceflow.tools import Tool


def configuration(**sections: Any) -> OnceflowConfiguration:
    """Every section at its default, ``sections`` (by field name: ``stripe=…``) replacing some."""
    values: dict[str, Any] = {}
    for name, field in OnceflowConfiguration.model_fields.items():
        section = field.annotation
        if isinstance(section, type) and issubclass(section, FileBackedSettings):
            values[name] = sections[name] if name in sections else section()
    return OnceflowConfiguration(**values)


def builtin(**sections: Any) -> tuple[Tool, ...]:
    """The built-in tools under ``configuration(**sections)``."""
    return builtin_tools(configuration(**sections))


def builtin_tool(name: str, **sections: Any) -> Tool:
    """One built-in tool by name, under ``configuration(**sections)``."""
    [tool] = [tool for tool in builtin(**sections) if tool.name == name]
    return tool
