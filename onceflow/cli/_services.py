"""Where a command finds onceflow's services and tools: the environment, else the embedded
stack."""

from onceflow.cli._failures import CommandFailed
from onceflow.settings import OnceflowSettings, load_settings
from onceflow.tools import ToolRegistrationError


def settings_and_database() -> tuple[OnceflowSettings, str]:
    """The settings and the database URL: ``DATABASE_URL``, else the embedded stack's."""
    from onceflow_devstack.stack import running_stack_database_url

    settings = load_settings()
    database_url = settings.database_url or running_stack_database_url(settings.state_dir)
    if database_url is None:
        raise CommandFailed(
            "DATABASE_URL is not set and no embedded stack has run from "
            f"{settings.state_dir}; run `onceflow dev` or set DATABASE_URL"
        )
    return settings, database_url


def register_configured_tools(settings: OnceflowSettings) -> list[str]:
    """Add the custom tools of ``ONCEFLOW_TOOLS`` to the catalogue, or fail with the fix;
    returns their names."""
    from onceflow.tools import load_configured_tools

    try:
        return [tool.name for tool in load_configured_tools(settings.tools)]
    except ToolRegistrationError as refused:
        raise CommandFailed(str(refused), exit_code=2) from None
