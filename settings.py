"""onceflow's process settings, read from the environment once at start-up.

Temporal's own connection settings (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``,
``TEMPORAL_API_KEY``, TLS, profile file) are read by ``temporalio.envconfig``, not here.
"""

from datetime import timedelta
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class OnceflowSettings(BaseSettings):
    """Settings shared by the worker, the CLI and the dev stack."""

    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_", extra="ignore")

    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    """PostgreSQL URL (``DATABASE_URL``). Default: the embedded server of ``onceflow dev``."""
    task_queue: str = "onceflow-tasks"
    """Temporal task queue of the task workflows and their activities. Default ``onceflow-tasks``."""
    state_dir: Path = Path(".onceflow")
    """Where the embedded stack keeps its data and pid files. Default ``./.onceflow``."""
    shutdown_grace: timedelta = Field(default=timedelta(seconds=30))
    """How long a stopping worker lets running activities finish. Default 30 s."""
    db_pool_max_size: int = Field(default=10, ge=1, le=200)
    """Most database connections one worker process holds. Default 10."""
