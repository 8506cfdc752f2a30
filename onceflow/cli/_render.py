"""How tasks look in a terminal."""

from rich.console import Console
from rich.table import Table

from onceflow.task_api import TaskSummary
from onceflow.workflows.task_models import TaskStatus

STATE_STYLES = {
    "succeeded": "green",
    "failed": "red",
    "parked": "bold yellow",
    "awaiting_approval": "cyan",
    "running": "blue",
}


def render_status(console: Console, status: TaskStatus) -> None:
    """A task's status: one row per step, then what an operator must do, if anything."""
    style = STATE_STYLES.get(status.state.value, "")
    console.print(
        f"[bold]{status.workflow_id}[/]  tenant {status.tenant}  "
        f"state [{style}]{status.state.value}[/]  "
        f"budget {status.budget.attempts_used} used / {status.budget.attempts_left} left"
    )
    table = Table("step", "tool", "state", "attempts", "resource", "notes")
    for step in status.steps:
        notes = step.failure_reason or step.park_reason or ""
        table.add_row(
            step.step_id,
            step.tool,
            f"[{STATE_STYLES.get(step.state.value, '')}]{step.state.value}[/]",
            ", ".join(attempt.outcome.value for attempt in step.attempts) or "-",
            step.resource_id or "-",
            notes,
        )
    console.print(table)
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
    """A table of tasks from the visibility store."""
    table = Table("task id", "state", "tenant", "started")
    for task in tasks:
        style = STATE_STYLES.get(task.state, "")
        table.add_row(
            task.workflow_id,
            f"[{style}]{task.state}[/]",
            task.tenant,
            f"{task.started_at:%Y-%m-%d %H:%M:%S}",
        )
    console.print(table)
    console.print(f"{len(tasks)} task(s)")
