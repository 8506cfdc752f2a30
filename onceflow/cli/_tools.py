"""``onceflow tools``: the catalogue a worker and the boundary would serve, custom tools
included, so an author sees that a tool registers (or why not) before starting anything."""

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from onceflow.cli._services import register_configured_tools
from onceflow.tools import ToolContract
from onceflow.tools.worker import CATALOGUE


def register(app: typer.Typer) -> None:
    """Add ``onceflow tools`` to ``app``."""

    @app.command("tools")
    def list_tools(
        as_json: Annotated[
            bool, typer.Option("--json", help="Print the contracts as JSON.")
        ] = False,
    ) -> None:
        """List every tool: the reference tools and those of ONCEFLOW_TOOLS, checked as the
        worker checks them (exit 2 with the fix when one is refused)."""
        from onceflow.cli._configuration import loaded_configuration

        custom = set(register_configured_tools(loaded_configuration()))
        if as_json:
            print(
                json.dumps(
                    [_describe(contract, contract.name in custom) for contract in CATALOGUE],
                    indent=2,
                )
            )
            return
        table = Table("tool", "source", "dedupe", "idempotent", "limit", "approval", "lookup")
        for contract in CATALOGUE:
            row = _describe(contract, contract.name in custom)
            table.add_row(*(str(row[column]) for column in row if column != "description"))
        # Wide enough for the names even when piped (rich assumes 80 columns then).
        Console(width=max(Console().width, 120)).print(table)


def _describe(contract: ToolContract, custom: bool) -> dict[str, object]:
    approval = "no"
    if contract.requires_approval:
        threshold = contract.approval_threshold
        approval = f"{threshold.argument} > {threshold.above}" if threshold else "always"
    return {
        "tool": contract.name,
        "source": "custom" if custom else "reference",
        "dedupe": contract.dedupe.value,
        "idempotent": contract.effects.idempotent,
        "attempt_limit": str(contract.attempt_timeout),
        "approval": approval,
        "lookup": "yes" if contract.lookup_activity else "no",
        "description": contract.description,
    }
