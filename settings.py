"""onceflow's process settings, read from the environment once at start-up.

Temporal's own connection settings (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``,
``TEMPORAL_API_KEY``, TLS, profile file) are read by ``temporalio.envconfig``, not here.
"""

from pathlib import Path
from typing import TypeVar

from pydantic import AliasChoices, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict


class OnceflowSettings(BaseSettings):
    """Settings shared by the worker, the CLI and the dev stack."""

    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_", extra="ignore")

    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    """PostgreSQL URL (``DATABASE_URL``). Default: the embedded server of ``onceflow dev``."""
    task_queue: str = "onceflow-tasks"
    """Task queue of the task workflows and their activities. Default ``onceflow-tasks``."""
    state_dir: Path = Path(".onceflow")
    """Where the embedded stack keeps its data and pid files. Default ``./.onceflow``."""
    shutdown_grace_seconds: float = Field(default=30.0, ge=0, le=3600)
    """How long a stopping worker lets running activities finish
    (``ONCEFLOW_SHUTDOWN_GRACE_SECONDS``). Default 30."""
    db_pool_max_size: int = Field(default=10, ge=1, le=200)
    """Most database connections one worker process holds. Default 10."""
    parked_scan_seconds: float = Field(default=30.0, gt=0, le=3600)
    """How often a worker that exports metrics counts parked tasks in Temporal's
    visibility store for the parked-task gauges (``ONCEFLOW_PARKED_SCAN_SECONDS``).
    Default 30."""


AnySettings = TypeVar("AnySettings", bound=BaseSettings)


class InvalidSettings(ValueError):
    """An environment variable holds a value onceflow cannot use."""


def read_settings(settings_class: type[AnySettings]) -> AnySettings:
    """Read a settings class from the environment; a bad value raises ``InvalidSettings``
    naming the environment variable, never a validation traceback."""
    try:
        return settings_class()
    except ValidationError as invalid:
        problems = "; ".join(
            f"{_variable_name(settings_class, problem['loc'])}: {problem['msg']}"
            for problem in invalid.errors()
        )
        raise InvalidSettings(f"invalid setting {problems}") from None


def load_settings() -> OnceflowSettings:
    """onceflow's own settings (see ``read_settings``)."""
    return read_settings(OnceflowSettings)


def _variable_name(settings_class: type[BaseSettings], location: tuple[int | str, ...]) -> str:
    name = str(location[0]) if location else "?"
    field = settings_class.model_fields.get(name)
    alias = field.validation_alias if field is not None else None
    if isinstance(alias, str):
        return alias
    if isinstance(alias, AliasChoices) and alias.choices:
        return str(alias.choices[0])
    prefix = str(settings_class.model_config.get("env_prefix", ""))
    return f"{prefix}{name}".upper()
