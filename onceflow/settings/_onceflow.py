"""``OnceflowSettings``: the ``[onceflow]`` table, shared by the worker, CLI and dev stack."""

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from onceflow.settings._base import FileBackedSettings
from onceflow.settings._reading import read_settings

BUILTIN_TOOL_NAMES = (
    "issue_coupon",
    "create_order",
    "charge_payment",
    "refund_payment",
    "send_email",
    "start_deployment",
)
"""The tools onceflow brings, in catalogue order."""


class OnceflowSettings(FileBackedSettings):
    """Settings shared by the worker, the CLI and the dev stack (``[onceflow]``)."""

    config_table = "onceflow"
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_", extra="ignore")

    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    """PostgreSQL URL (``DATABASE_URL``). Default none: the worker, gateway, MCP server and
    relay refuse to start without it (``onceflow dev`` runs its own)."""
    task_queue: str = "onceflow-tasks"
    """Task queue of the task workflows and their activities. Default ``onceflow-tasks``."""
    state_dir: Path = Path(".onceflow")
    """Where the embedded stack keeps its data and pid files. Default ``./.onceflow``."""
    shutdown_grace_seconds: float = Field(default=30.0, ge=0, le=3600)
    """How long a stopping worker lets running activities finish
    (``ONCEFLOW_SHUTDOWN_GRACE_SECONDS``). Default 30."""
    db_pool_max_size: int = Field(default=10, ge=1, le=200)
    """Most database connections one worker process holds. Default 10."""
    max_cached_tasks: int = Field(default=1000, ge=1, le=100_000)
    """Most tasks one worker keeps in memory between their workflow tasks (Temporal's
    workflow cache, ``ONCEFLOW_MAX_CACHED_TASKS``). Default 1,000. A waiting or parked task
    past it is evicted and, when a call or a decision wakes it, replayed from its history:
    worker memory stays bounded whatever the backlog, at the price of a replay per wake."""
    parked_scan_seconds: float = Field(default=30.0, gt=0, le=3600)
    """How often a worker that exports metrics counts parked tasks in Temporal's
    visibility store for the parked-task gauges (``ONCEFLOW_PARKED_SCAN_SECONDS``).
    Default 30."""
    provider_budgets: bool = True
    """Whether tool sends draw on their provider's fleet-wide retry budget and honour
    its pause and its 429s (``ONCEFLOW_PROVIDER_BUDGETS``). Default true; false only to
    measure without them (each task's own budget still bounds its retries)."""
    task_queue_activities_per_second: float | None = Field(default=None, ge=0)
    """Most activity tasks per second Temporal dispatches from the task queue to the whole
    fleet (``ONCEFLOW_TASK_QUEUE_ACTIVITIES_PER_SECOND``): a limit the server enforces,
    sent with each worker's polls (Temporal's ``max_task_queue_activities_per_second``).
    Default none: no limit. Set it to the rate the providers of the served tools declare
    (``onceflow provider status``: Stripe's 100) where the fleet can reach it; it holds
    every tool's activities, and with it set no activity starts eagerly. Set it alike on
    every worker of the queue: the last worker to poll sets the server's limit."""
    nexus_principal: str | None = None
    """The onceflow principal, ``TENANT/NAME``, that the worker's Nexus service
    (``OnceflowTools``, docs/nexus.md) acts as for every caller the endpoint lets through
    (``ONCEFLOW_NEXUS_PRINCIPAL``): its tenant's tasks, its allowed tools. Default none: the
    worker serves no Nexus service. ``onceflow dev`` sets it to its demo agent."""
    tools: Annotated[tuple[str, ...], NoDecode] = ()
    """Custom tools to register, each an entry point name in the ``onceflow.tools`` group
    or an import path ``package.module:ATTRIBUTE``. Default none.

    ``ONCEFLOW_TOOLS`` is comma-separated (``a, b``); the file holds an array
    (``tools = ["a", "b"]``)."""

    builtin_tools: Annotated[tuple[str, ...], NoDecode] = BUILTIN_TOOL_NAMES
    """The built-in tools this deployment serves (``ONCEFLOW_BUILTIN_TOOLS``, comma-separated;
    ``builtin_tools = [...]`` in the file). Default all six. A worker refuses to start while
    a tool it serves lacks a service its family needs (the line names the setting): set
    the service, or leave the tool out here, on every worker and gateway alike."""

    @field_validator("tools", "builtin_tools", mode="before")
    @classmethod
    def _split_comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("builtin_tools")
    @classmethod
    def _known_builtin_tools(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [name for name in value if name not in BUILTIN_TOOL_NAMES]
        if unknown:
            raise ValueError(
                f"unknown built-in tool(s) {', '.join(unknown)}; the built-in tools are "
                f"{', '.join(BUILTIN_TOOL_NAMES)}"
            )
        return tuple(dict.fromkeys(value))


def load_settings() -> OnceflowSettings:
    """onceflow's own settings (see ``read_settings``)."""
    return read_settings(OnceflowSettings)
