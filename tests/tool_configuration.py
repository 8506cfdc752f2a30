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
    """Every section at its default, ``sections`` replacing some: a shared one by field
    name (``payload_encryption=…``), a tool family's by any name (``stripe=…``)."""
    values: dict[str, Any] = {}
    for name, field in OnceflowConfiguration.model_fields.items():
        section = field.annotation
        if isinstance(section, type) and issubclass(section, FileBackedSettings):
            values[name] = sections[name] if name in sections else section()
    others = [section for name, section in sections.items() if name not in values]
    return OnceflowConfiguration(**values).with_sections(*others)


def builtin(**sections: Any) -> tuple[Tool, ...]:
    """The built-in tools under ``configuration(**sections)``."""
    return builtin_tools(configuration(**sections))


def builtin_tool(name: str, **sections: Any) -> Tool:
    """One built-in tool by name, under ``configuration(**sections)``."""
    [tool] = [tool for tool in builtin(**sections) if tool.name == name]
    return tool
