"""``onceflow audit``: compare a tool family's effects at its provider with onceflow's
records over a time window (duplicates, orphans, missing resources, totals).

Registered on the main app by ``register``. A tool family offers an audit by declaring
how to open its ``Auditor`` (``ToolFamily.open_auditor``); payments is onceflow's own
family that does. The report is a table on standard output (``--json``: one JSON object),
the progress bar on standard error; the command leaves with ``FINDINGS_EXIT_CODE`` when
there is any finding, 0 when the window is clean. With ``--schedule`` it creates the
Temporal Schedule that audits on the workers instead (``_audit_schedule``).
"""

import json
import re
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import TypeAdapter, ValidationError
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from onceflow.cli._failures import CommandFailed, ExitCode
from onceflow.cli._services import settings_and_database
from onceflow.cli.plugin import operate
from onceflow.tools import AuditProgress, AuditReport, AuditWindow, ProviderUnreadable

if TYPE_CHECKING:
    from onceflow.configuration import OnceflowConfiguration
    from onceflow.tools import Auditor

FINDINGS_EXIT_CODE = 6
"""``onceflow audit`` found a duplicate, an orphan or a missing resource (0: clean)."""


DEFAULT_FAMILY = "payments"


@asynccontextmanager
async def opened_auditor(
    configuration: "OnceflowConfiguration", database_url: str, family: str
) -> AsyncIterator["Auditor"]:
    """The audit of ``family``, one of the configured families (onceflow's and the custom
    ones), with its provider client and a database pool open for the block.

    Raises:
        CommandFailed: No configured family of that name offers an audit, or this
            process's settings lack its provider (exit 2).
    """
    from onceflow.activities import configured_families
    from onceflow.storage import build_pool

    families = {f.name: f for f in configured_families(configuration) if f.open_auditor}
    chosen = families.get(family)
    if chosen is None or chosen.open_auditor is None:
        raise _no_audit(family, families)
    async with (
        build_pool(database_url, max_size=2) as pool,
        chosen.open_auditor(pool) as auditor,
    ):
        if auditor is None:
            missing = "; ".join(f"{p.problem}; fix: {p.fix}" for p in chosen.problems)
            raise CommandFailed(
                f"the {family} family's provider is not configured here: "
                f"{missing or 'see its settings'} (as the workers have it)",
                exit_code=ExitCode.BAD_INPUT,
            )
        yield auditor


_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_moment(value: str, *, now: datetime, option: str) -> datetime:
    """An ISO 8601 time (UTC when it names no offset), or a duration before ``now``
    (``90m``, ``24h``, ``7d``, ``PT6H``).

    Raises:
        CommandFailed: ``value`` is neither (exit 2).
    """
    relative = _DURATION.fullmatch(value.strip())
    if relative:
        return now - timedelta(**{_UNITS[relative.group(2)]: int(relative.group(1))})
    if value.strip().upper().startswith("P"):
        return now - parse_duration(value, option=option)
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise CommandFailed(
            f"{option} {value!r} is neither a time (2026-12-01T00:00:00Z) nor a duration "
            "before now (90m, 24h, 7d, PT6H)",
            exit_code=ExitCode.BAD_INPUT,
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def parse_duration(value: str, *, option: str) -> timedelta:
    """``15m``, ``2h``, ``PT15M`` or a number of seconds.

    Raises:
        CommandFailed: ``value`` is not a duration (exit 2).
    """
    relative = _DURATION.fullmatch(value.strip())
    if relative:
        return timedelta(**{_UNITS[relative.group(2)]: int(relative.group(1))})
    if value.strip().isdigit():
        return timedelta(seconds=int(value.strip()))
    try:
        duration = TypeAdapter(timedelta).validate_python(value.strip())
    except ValidationError:
        duration = timedelta(-1)
    if duration < timedelta(0):
        raise CommandFailed(
            f"{option} {value!r} is not a duration (15m, 2h, PT15M)", exit_code=ExitCode.BAD_INPUT
        )
    return duration


def register(app: typer.Typer) -> None:
    """Add ``onceflow audit`` to ``app``."""

    @app.command()
    def audit(
        since: Annotated[
            str,
            typer.Option(
                help="Start of the window: an ISO 8601 time (UTC unless it names an "
                "offset) or a duration before now (24h, 7d, PT6H)."
            ),
        ],
        until: Annotated[
            str | None,
            typer.Option(help="End of the window (exclusive), like --since. Default: now."),
        ] = None,
        family: Annotated[
            str,
            typer.Option(
                help="The tool family to audit against its provider (one that offers an "
                "audit: payments, or a custom family's)."
            ),
        ] = DEFAULT_FAMILY,
        in_flight_grace: Annotated[
            str,
            typer.Option(
                help="A step still running whose record changed less than this long ago "
                "may be recording its effect: not an orphan yet."
            ),
        ] = "15m",
        as_json: Annotated[
            bool, typer.Option("--json", help="Print the report as one JSON object.")
        ] = False,
        schedule: Annotated[
            str | None,
            typer.Option(
                help="Instead of auditing now, create (or update) a Temporal Schedule that "
                "audits every this long (1h, PT30M) on the workers, each run the --since "
                "duration back; findings go to its result, the Temporal UI and the "
                "onceflow_audit_findings gauge."
            ),
        ] = None,
        temporal_address: Annotated[
            str | None,
            typer.Option(
                help="With --schedule: Temporal frontend host:port (default: "
                "TEMPORAL_ADDRESS or localhost:7233)."
            ),
        ] = None,
    ) -> None:
        """Compare a tool family's effects at its provider with onceflow's records.

        Reads the provider's consistent list API (PaymentIntents and refunds for
        payments) and the operations created in the window, and reports operations with
        more than one effect (duplicate), effects no step owns or whose step did not
        succeed (orphan), succeeded steps whose resource the provider lacks (missing),
        and the effects' totals per currency. Exit 0 when clean, 6 on any finding.
        """
        from onceflow.cli._configuration import loaded_configuration

        if schedule is not None:
            _schedule(family, schedule, since, until, in_flight_grace, temporal_address)
            return
        now = datetime.now(UTC)
        try:
            window = AuditWindow(
                since=parse_moment(since, now=now, option="--since"),
                until=parse_moment(until, now=now, option="--until") if until else now,
                in_flight_grace=parse_duration(in_flight_grace, option="--in-flight-grace"),
            )
        except ValueError as invalid:
            raise CommandFailed(
                f"--since must come before --until: {invalid}", exit_code=ExitCode.BAD_INPUT
            ) from None
        _, database_url = settings_and_database()
        configuration = loaded_configuration()
        errors = Console(stderr=True)

        async def body() -> AuditReport:
            async with opened_auditor(configuration, database_url, family) as auditor:
                with _progress_bar(errors) as progress:
                    try:
                        return await auditor.audit(window, progress=progress)
                    except ProviderUnreadable as failure:
                        raise _provider_failed(failure) from None

        report = operate(body)
        if as_json:
            print(json.dumps(report.to_json()), flush=True)
        else:
            render_report(Console(), report)
        if not report.clean:
            raise typer.Exit(FINDINGS_EXIT_CODE)


def _schedule(
    family: str,
    every: str,
    since: str,
    until: str | None,
    in_flight_grace: str,
    temporal_address: str | None,
) -> None:
    """``audit --schedule``: the schedule created or updated, one line saying which."""
    from onceflow.cli._audit_schedule import ensure_audit_schedule
    from onceflow.cli._configuration import loaded_configuration
    from onceflow.task_api import connect_temporal
    from onceflow.tools.worker import AuditRunInput

    if until is not None:
        raise CommandFailed(
            "--until does not go with --schedule: each run audits the --since duration "
            "up to its own start",
            exit_code=ExitCode.BAD_INPUT,
        )
    if _DURATION.fullmatch(since.strip()) is None and not since.strip().upper().startswith("P"):
        raise CommandFailed(
            f"with --schedule, --since is how far back each run reads: a duration (2h, "
            f"PT2H), not {since!r}",
            exit_code=ExitCode.BAD_INPUT,
        )
    interval = parse_duration(every, option="--schedule")
    request = AuditRunInput(
        family=family,
        window=parse_duration(since, option="--since"),
        in_flight_grace=parse_duration(in_flight_grace, option="--in-flight-grace"),
    )
    if interval <= timedelta(0) or request.window < interval:
        raise CommandFailed(
            "--since must be at least --schedule (> 0), so that consecutive windows leave no gap",
            exit_code=ExitCode.BAD_INPUT,
        )
    configuration = loaded_configuration()
    from onceflow.activities import configured_families

    offered = [f.name for f in configured_families(configuration) if f.open_auditor]
    if family not in offered:
        raise _no_audit(family, offered)

    async def body() -> tuple[str, bool]:
        client = await connect_temporal(
            address=temporal_address, encryption=configuration.payload_encryption
        )
        return await ensure_audit_schedule(
            client,
            task_queue=configuration.onceflow.task_queue,
            every=interval,
            request=request,
        )

    schedule_id, created = operate(body)
    print(
        f"{'created' if created else 'updated'} schedule {schedule_id}: audits "
        f"{family} every {interval}, each run the {request.window} before it",
        flush=True,
    )


def _no_audit(family: str, offered: Iterable[str]) -> CommandFailed:
    return CommandFailed(
        f"no tool family named {family!r} offers an audit here; fix: choose one of "
        f"{', '.join(sorted(offered)) or 'none (no loaded family offers one)'}",
        exit_code=ExitCode.BAD_INPUT,
    )


def _provider_failed(failure: ProviderUnreadable) -> CommandFailed:
    """A read the audit needs failed: nothing can be concluded from the window."""
    said = f"the provider could not be read, so the audit concludes nothing: {failure.detail}"
    if failure.credentials_refused:
        exit_code = ExitCode.CREDENTIALS_REFUSED
    elif failure.transient:
        exit_code = ExitCode.UNAVAILABLE
    else:
        exit_code = ExitCode.FAILED
    return CommandFailed(f"{said}; fix: {failure.fix}", exit_code=exit_code)


@contextmanager
def _progress_bar(console: Console) -> Iterator[AuditProgress]:
    """A bar on standard error over the window read so far, only on a terminal."""
    progress = Progress(
        TextColumn("reading {task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    task = progress.add_task("the provider", total=1.0)

    def advance(what: str, done: float) -> None:
        progress.update(task, description=what, completed=done)

    with progress:
        yield advance


def render_report(console: Console, report: AuditReport) -> None:
    """The report for people: the window, one row per finding, the totals."""
    window = report.window
    console.print(
        f"[bold]audit of {report.family}[/] from {window.since.isoformat(timespec='seconds')} "
        f"to {window.until.isoformat(timespec='seconds')}: {report.effects_read} provider "
        f"object(s), {report.operations_read} record(s)",
        soft_wrap=True,
        highlight=False,
    )
    if report.findings:
        table = Table(
            Column("finding", no_wrap=True),
            Column("tool", no_wrap=True),
            Column("task / step", no_wrap=True),
            Column("resources", no_wrap=True),
            Column("detail", overflow="fold", min_width=30),
        )
        for finding in report.findings:
            table.add_row(
                f"[{_STYLE[finding.kind.value]}]{finding.kind.value}[/]",
                finding.tool,
                f"{finding.workflow_id} / {finding.step_id}" if finding.workflow_id else "-",
                "\n".join(finding.resource_ids),
                finding.detail,
            )
        console.print(table, crop=False)
    counts = ", ".join(f"{count} {kind}" for kind, count in report.counts.items())
    verdict = "[green]clean[/]" if report.clean else "[bold red]findings[/]"
    console.print(f"{verdict}: {counts}", highlight=False)
    if report.in_flight:
        console.print(
            f"{report.in_flight} effect(s) of steps still running within the grace: not judged",
            highlight=False,
        )
    totals = Table(
        Column("effect"),
        Column("currency"),
        Column("count", justify="right"),
        Column("amount (minor units)", justify="right"),
        title="onceflow's effects in the window",
    )
    for total in report.totals:
        totals.add_row(total.kind, total.currency, str(total.count), str(total.amount))
    if report.totals:
        console.print(totals)
    else:
        console.print("no effect of onceflow's in the window", highlight=False)


_STYLE = {"duplicate": "bold red", "orphan": "bold yellow", "missing": "bold magenta"}
