"""``onceflow provider status|pause|resume``: the providers the configured tools reach, as
the whole fleet sees them (healthy, shedding retries, throttled, paused), and the switch
an operator who knows a provider is down pauses every send to it with.

A pause and a resume are audited in the database (who, when, why) and take effect on
every worker at its next send: a paused provider receives nothing, first attempts
included; the steps held wait, off their tasks' clocks, and go on once it is resumed.
"""

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from onceflow.cli._failures import CommandFailed, ExitCode
from onceflow.cli._services import settings_and_database
from onceflow.cli.plugin import console, operate

if TYPE_CHECKING:
    from onceflow.tools.providers import Provider, ProviderState

Name = Annotated[str, typer.Argument(help="The provider's name (see `onceflow provider status`).")]
Reason = Annotated[
    str, typer.Option("--reason", help="Why, for the audit (e.g. the incident's link).")
]
Operator = Annotated[str | None, typer.Option("--operator", help="Who decides (default: $USER).")]


def register(app: typer.Typer, operator_name: Any) -> None:
    """Add ``onceflow provider`` to ``app``; ``operator_name()`` names the default operator."""
    group = typer.Typer(
        name="provider",
        help="The providers tools reach: their fleet-wide retry budget, pause and resume.",
        no_args_is_help=True,
    )
    app.add_typer(group)

    @group.command("status")
    def status(
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Each provider's state across the fleet, its bucket and its latest pauses."""
        providers = _declared_providers()

        async def body() -> None:
            from onceflow.storage import build_pool
            from onceflow.tools.providers import pause_history, provider_states

            _, database_url = settings_and_database()
            async with build_pool(database_url, max_size=1) as pool:
                states = {state.name: state for state in await provider_states(pool)}
                rows = []
                for name, provider in sorted(providers.items()):
                    history = await pause_history(pool, name, limit=3)
                    rows.append(_describe(provider, states.get(name), history))
            if as_json:
                print(json.dumps(rows, indent=2))
                return
            table = Table("provider", "state", "retry tokens", "since", "notes")
            for row in rows:
                table.add_row(
                    row["provider"],
                    row["state"],
                    f"{row['tokens']:g} / {row['retry_tokens']:g}",
                    row["since"] or "-",
                    row["notes"],
                )
            console.print(table)

        operate(body)

    @group.command("pause")
    def pause(name: Name, reason: Reason, operator: Operator = None) -> None:
        """Pause every send to a provider, fleet-wide, until `onceflow provider resume`:
        nothing is sent to it, first attempts included; its steps wait off their tasks'
        clocks (up to each tool's provider wait limit). Audited."""
        operate(lambda: _switch(name, reason, operator or operator_name(), pausing=True))

    @group.command("resume")
    def resume(name: Name, reason: Reason, operator: Operator = None) -> None:
        """Resume a paused provider: its waiting steps send again at their next check
        (within about 15 s). Audited."""
        operate(lambda: _switch(name, reason, operator or operator_name(), pausing=False))


async def _switch(name: str, reason: str, operator: str, *, pausing: bool) -> None:
    """Pause or resume ``name`` and say what changed (nothing, when it already was)."""
    from onceflow.storage import build_pool
    from onceflow.tools.providers import pause_provider, resume_provider

    provider = _provider(name)
    _, database_url = settings_and_database()
    switch = pause_provider if pausing else resume_provider
    async with build_pool(database_url, max_size=1) as pool:
        pause = await switch(pool, provider, operator=operator, reason=reason)
    if pausing and pause is None:
        said = f"paused {name}: nothing is sent to it until `onceflow provider resume {name}`"
    elif pause is None:
        said = f"{name} was not paused; unchanged"
    else:
        by = f"{pause.by} at {pause.at.isoformat(timespec='seconds')} ({pause.reason})"
        said = (
            f"{name} was already paused by {by}; unchanged"
            if pausing
            else f"resumed {name}, paused by {by}"
        )
    console.print(said, highlight=False)


def _declared_providers() -> dict[str, "Provider"]:
    """The providers of the configured tools (built-in and custom), by name."""
    from onceflow.cli._configuration import loaded_configuration
    from onceflow.cli._services import register_configured_tools
    from onceflow.tools.worker import CATALOGUE

    register_configured_tools(loaded_configuration())
    providers: dict[str, Provider] = {}
    for contract in CATALOGUE:
        provider = contract.budget_provider
        if provider is not None:
            providers.setdefault(provider.name, provider)
    return providers


def _provider(name: str) -> "Provider":
    providers = _declared_providers()
    if name not in providers:
        raise CommandFailed(
            f"no configured tool reaches a provider named {name!r}; fix: name one of "
            f"{', '.join(sorted(providers)) or 'none'} (`onceflow provider status`)",
            exit_code=ExitCode.BAD_INPUT,
        )
    return providers[name]


def _describe(
    provider: "Provider", state: "ProviderState | None", history: list[Any]
) -> dict[str, Any]:
    from onceflow.tools.providers import ProviderHealth

    row = state.row if state is not None else None
    health = state.health(provider) if state is not None else ProviderHealth.HEALTHY
    since = None
    notes = ""
    if row is not None and row.pause is not None:
        since = row.pause.at.isoformat(timespec="seconds")
        notes = f"paused by {row.pause.by}: {row.pause.reason}"
    elif row is not None and health is ProviderHealth.THROTTLED and row.hold_until:
        notes = f"said not now (429) until {row.hold_until.isoformat(timespec='seconds')}"
    elif row is not None and row.failing_since is not None:
        since = row.failing_since.isoformat(timespec="seconds")
        notes = f"failing; one retry per {provider.probe_every.total_seconds():g} s probes it"
    return {
        "provider": provider.name,
        "state": health.value,
        "tokens": round(state.tokens(provider), 2) if state is not None else provider.retry_tokens,
        "retry_tokens": provider.retry_tokens,
        "since": since,
        "notes": notes,
        "requests_per_second": provider.requests_per_second,
        "audit": [
            {
                "action": entry.action,
                "operator": entry.operator,
                "reason": entry.reason,
                "at": entry.at.isoformat(),
            }
            for entry in history
        ],
    }
