"""Where a command finds onceflow's services: the environment, else the embedded stack."""

from cli._failures import CommandFailed
from settings import OnceflowSettings, load_settings


def settings_and_database() -> tuple[OnceflowSettings, str]:
    """The settings and the database URL: ``DATABASE_URL``, else the embedded stack's."""
    from devstack.stack import running_stack_database_url

    settings = load_settings()
    database_url = settings.database_url or running_stack_database_url(settings.state_dir)
    if database_url is None:
        raise CommandFailed(
            "DATABASE_URL is not set and no embedded stack has run from "
            f"{settings.state_dir}; run `onceflow dev` or set DATABASE_URL"
        )
    return settings, database_url
