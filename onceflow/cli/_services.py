"""Where a command finds onceflow's services and tools: its configuration, never a dev stack
it happens to find on the machine (``onceflow dev`` writes the settings to join it into
``.onceflow/dev.env``)."""

from onceflow.cli._failures import CommandFailed
from onceflow.settings import OnceflowSettings, load_settings
from onceflow.tools import ToolRegistrationError


def settings_and_database() -> tuple[OnceflowSettings, str]:
    """The settings and the database URL (``DATABASE_URL``), or one line saying how to set it."""
    settings = load_settings()
    if not settings.database_url:
        raise CommandFailed(
            "DATABASE_URL is not set; fix: set it to your PostgreSQL "
            "(postgresql://user:password@host/db), or to join a running `onceflow dev`: "
            "source .onceflow/dev.env",
            exit_code=2,
        )
    return settings, settings.database_url


def register_configured_tools(settings: OnceflowSettings) -> list[str]:
    """Add the custom tools of ``ONCEFLOW_TOOLS`` to the catalogue, or fail with the fix;
    returns their names."""
    from onceflow.tools import load_configured_tools

    try:
        return [tool.name for tool in load_configured_tools(settings.tools)]
    except ToolRegistrationError as refused:
        raise CommandFailed(str(refused), exit_code=2) from None
