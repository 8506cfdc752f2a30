"""Where a command finds onceflow's services and tools: its configuration, never a dev stack
it happens to find on the machine (``onceflow dev`` writes the settings to join it into
``.onceflow/dev.env``)."""

from typing import TYPE_CHECKING

from onceflow.cli._failures import CommandFailed
from onceflow.settings import OnceflowSettings
from onceflow.tools import ToolRegistrationError

if TYPE_CHECKING:  # the configuration imports every tool family: only when a command runs
    from onceflow.configuration import OnceflowConfiguration


def settings_and_database() -> tuple[OnceflowSettings, str]:
    """The loaded ``[onceflow]`` settings and the database URL (``DATABASE_URL``), or one line
    saying how to set it."""
    from onceflow.cli._configuration import loaded_configuration

    settings = loaded_configuration().onceflow
    if not settings.database_url:
        raise CommandFailed(
            "DATABASE_URL is not set; fix: set it to your PostgreSQL "
            "(postgresql://user:password@host/db), or to join a running `onceflow dev`: "
            "source .onceflow/dev.env",
            exit_code=2,
        )
    return settings, settings.database_url


def register_configured_tools(configuration: "OnceflowConfiguration") -> list[str]:
    """Add the built-in tools (built from ``configuration``) and the custom tools of
    ``ONCEFLOW_TOOLS`` to the catalogue, or fail with the fix; returns the custom tools'
    names."""
    from onceflow.activities import builtin_tools
    from onceflow.tools import load_tools, register_tools

    try:
        builtin = builtin_tools(configuration)
        custom = load_tools(configuration.onceflow.tools)
        register_tools((*builtin, *custom))
    except (ToolRegistrationError, ValueError) as refused:
        raise CommandFailed(str(refused), exit_code=2) from None
    return [tool.name for tool in custom]
