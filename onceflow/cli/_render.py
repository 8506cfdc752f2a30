"""How tasks look in a terminal."""

import json

from rich.console import Console
from rich.table import Column, Table

from onceflow.task_api import TaskSummary
from onceflow.workflows.task_models import TaskStatus

STATE_STYLES = {
    "succeeded": "green",
    "failed": "red",
    "parked": "bold yellow",
    "awaiting_approval": "cyan",
    "running": "blue",
    "closed": "green",
}


def render_status(console: Console, status: TaskStatus) -> None:
    """A task's status: one row per step, then what an operator must do, if anything."""
    style = STATE_STYLES.get(status.state.value, "")
    kind = ""
    if status.open:
        closing = f", closing: {status.closing}" if status.closing else ""
        kind = f"  open task, {len(status.steps)} call(s), run {status.runs}{closing}"
    console.print(
        f"[bold]{status.workflow_id}[/]  tenant {status.tenant}  "
        f"state [{style}]{status.state.value}[/]  "
        f"budget {status.budget.attempts_used} used / {status.budget.attempts_left} left"
        f"{kind}",
        soft_wrap=True,
    )
    headers = ("call" if status.open else "step", "tool", "state", "attempts", "resource", "notes")
    table = Table(
        *(Column(header, no_wrap=header != "notes", overflow="fold") for header in headers)
    )
    cells: list[tuple[str, ...]] = [headers[:-1]]
    for step in status.steps:
        notes = step.failure_reason or step.park_reason or step.waiting_for_provider or ""
        if step.repeat_of:
            notes = f"repeat of {step.repeat_of}: answered by it, not run"
        elif step.deliberate_repeat:
            notes = f"deliberate repeat; {notes}" if notes else "deliberate repeat"
        attempts = ", ".join(attempt.outcome.value for attempt in step.attempts) or "-"
        resource = step.resource_id or "-"
        table.add_row(
            step.step_id,
            step.tool,
            f"[{STATE_STYLES.get(step.state.value, '')}]{step.state.value}[/]",
            attempts,
            resource,
            notes,
        )
        cells.append((step.step_id, step.tool, step.state.value, attempts, resource))
    # Ids whole; the notes column takes what is left (at least 30 columns) and wraps.
    widths = [max(len(row[column]) for row in cells) for column in range(len(cells[0]))]
    _print_at_least(console, table, sum(widths) + 3 * (len(widths) + 1) + 1 + 30)
    for step in status.steps:
        if step.reconcile_command:
            evidence = ", ".join(f"{name}={value}" for name, value in sorted(step.evidence.items()))
            console.print(f"evidence for {step.step_id}: {evidence or 'none'}")
            console.print(f"decide with: [bold]{step.reconcile_command}[/]", soft_wrap=True)
        if step.state.value == "awaiting_approval":
            console.print(
                f"step {step.step_id} awaits approval of {step.arguments}", soft_wrap=True
            )
            console.print(
                f"decide with: [bold]onceflow approve {status.workflow_id} --step {step.step_id} "
                "--approve|--deny --reason TEXT[/]",
                soft_wrap=True,
            )


def render_task_list(console: Console, tasks: list[TaskSummary]) -> None:
    """A table of tasks from the visibility store, every id in full whatever the width."""
    headers = ("task id", "kind", "state", "tenant", "started")
    rows = [
        (
            task.workflow_id,
            task.kind,
            task.state,
            task.tenant,
            f"{task.started_at:%Y-%m-%d %H:%M:%S}",
        )
        for task in tasks
    ]
    table = Table(*(Column(header, no_wrap=True) for header in headers))
    for workflow_id, kind, state, tenant, started in rows:
        style = STATE_STYLES.get(state, "")
        table.add_row(workflow_id, kind, f"[{style}]{state}[/]", tenant, started)
    _print_uncut(console, table, [headers, *rows])
    console.print(f"{len(tasks)} task(s)")


def task_list_json(tasks: list[TaskSummary]) -> str:
    """The task list as JSON (``onceflow tasks --json``): one object per task."""
    return json.dumps(
        [
            {
                "task_id": task.workflow_id,
                "kind": task.kind,
                "state": task.state,
                "tenant": task.tenant,
                "started_at": task.started_at.isoformat(),
            }
            for task in tasks
        ]
    )


def _print_uncut(console: Console, table: Table, cells: list[tuple[str, ...]]) -> None:
    # Rich shrinks and ellipsizes columns to the terminal (80 columns when piped); an id
    # an operator copies into the next command must come out whole, so the table is as
    # wide as its widest row and the line runs past the terminal's edge instead.
    widths = [max(len(row[column]) for row in cells) for column in range(len(cells[0]))]
    _print_at_least(console, table, sum(widths) + 3 * len(widths) + 1)


def _print_at_least(console: Console, table: Table, width: int) -> None:
    # ``print(width=…)`` can only narrow the console, so widen the console itself.
    before = console.width
    console.width = max(before, width)
    try:
        console.print(table, crop=False)
    finally:
        console.width = before
