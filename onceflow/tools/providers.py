"""The providers' side of the fleet, for the worker, the CLI and the workflow: what a held
attempt carries (``ProviderHold``), what kind of send asks (``Send``), each provider's
state in PostgreSQL (``provider_states``), its pause and resume (audited), and the gauge
of its state. A tool author declares a ``Provider`` (exported by ``onceflow.tools`` too)
and needs nothing else from here."""

from onceflow.tools._attempts import ProviderHold
from onceflow.tools._provider import Provider, ProviderHealth, Send
from onceflow.tools._provider_budgets import (
    PauseRecord,
    ProviderState,
    pause_history,
    pause_provider,
    provider_states,
    resume_provider,
    watch_provider_health,
)

__all__ = [
    "PauseRecord",
    "Provider",
    "ProviderHealth",
    "ProviderHold",
    "ProviderState",
    "Send",
    "pause_history",
    "pause_provider",
    "provider_states",
    "resume_provider",
    "watch_provider_health",
]
