"""Where a command finds onceflow's services and tools: its configuration, never a dev stack
it happens to find on the machine (``onceflow dev`` writes the settings to join it into
``.onceflow/dev.env``)."""

from typing import TYPE_CHECKING

from onceflow.cli._failures import CommandFailed, ExitCode, database_unreachable
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
            exit_code=ExitCode.BAD_INPUT,
        )
    return settings, settings.database_url


async def reach_database(database_url: str) -> None:
    """Connect to PostgreSQL once, or fail with the reason and the fix.

    A long-running command checks this before it says it is ready: its pool connects
    lazily, so without the check a wrong ``DATABASE_URL`` would surface only at the first
    request (or the first task's attempt), long after start-up looked fine.
    """
    import psycopg

    try:
        connection = await psycopg.AsyncConnection.connect(database_url, connect_timeout=5)
    except psycopg.OperationalError as failed:
        raise database_unreachable(failed) from None
    await connection.close()


def register_configured_tools(configuration: "OnceflowConfiguration") -> list[str]:
    """Add the built-in tools (built from ``configuration``) and the custom tools of
    ``ONCEFLOW_TOOLS`` to the catalogue, or fail with the fix; returns the custom tools'
    names."""
    from onceflow.activities import builtin_tools
    from onceflow.tools.worker import load_tools, register_tools

    try:
        builtin = builtin_tools(configuration)
        custom = load_tools(configuration.onceflow.tools, configuration)
        register_tools((*builtin, *custom))
    except (ToolRegistrationError, ValueError) as refused:
        raise CommandFailed(str(refused), exit_code=ExitCode.BAD_INPUT) from None
    return [tool.name for tool in custom]
