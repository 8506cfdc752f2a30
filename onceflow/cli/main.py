"""``onceflow``: run the embedded stack and workers, call tools, inspect and decide tasks.

Every command fails with one line per problem on standard error, the fix in it, and an
exit code saying what kind of failure it was (``ExitCode``): 2 bad input or settings (a
key already used for other arguments included), 69 Temporal or PostgreSQL unreachable,
77 credentials refused, 1 anything else. Long-running commands (``worker``, ``relay``,
``gateway``, ``mcp``, ``dev``) check their settings and reach their dependencies before
they say they are ready, so a start-up failure is one of those lines too. Machine-readable
output (``call``, ``status --json``, ``tasks --json``) is JSON on standard output.
``call --wait`` leaves with the task's final state (``WAIT_EXIT_CODES``), ``audit`` with 6
when it found anything (``FINDINGS_EXIT_CODE``).
"""

import asyncio
import json
import os
from typing import Annotated, Any

import typer

from onceflow.cli._audit import register as register_audit_command
from onceflow.cli._boundary import register as register_boundary_commands
from onceflow.cli._configuration import register as register_configuration_commands
from onceflow.cli._failures import EXIT_CODES_HELP, CommandFailed, ExitCode, explain
from onceflow.cli._providers import register as register_provider_commands
from onceflow.cli._render import render_status, render_task_list, task_list_json
from onceflow.cli._services import (
    reach_database,
    register_configured_tools,
    settings_and_database,
)
from onceflow.cli._tools import register as register_tool_commands
from onceflow.cli.plugin import (
    console,
    errors,
    operate,
    print_failure,
    register_plugin_commands,
    stop_on_signals,
)
from onceflow.errors import MalformedIdempotencyKey
from onceflow.settings import InvalidSettings, load_settings, read_settings
from onceflow.task_api import DecisionAnswer, TaskClient, connect_temporal
from onceflow.telemetry import boundary_span, process_telemetry
from onceflow.tools.worker import (
    CATALOGUE,
    check_idempotency_key,
    derive_task_workflow_id,
    key_digest,
)
from onceflow.workflows.task_models import (
    AgentTaskInput,
    ApproveInput,
    ReconcileDecision,
    ReconcileInput,
    StepInput,
    StepState,
    TaskState,
    TaskStatus,
)

app = typer.Typer(
    name="onceflow",
    help="Durable, retry-safe agent tool calls on Temporal.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

TaskId = Annotated[str, typer.Argument(help="The task's workflow id.")]
TemporalAddress = Annotated[
    str | None,
    typer.Option(help="Temporal frontend host:port (default: TEMPORAL_ADDRESS or localhost:7233)."),
]


WAIT_EXIT_CODES: dict[TaskState, int] = {
    TaskState.SUCCEEDED: 0,
    TaskState.FAILED: 3,
    TaskState.PARKED: 4,
    TaskState.AWAITING_APPROVAL: 5,
}
"""``call --wait`` exits with the state the task stopped in: 0 succeeded, 3 failed,
4 parked (a person must reconcile), 5 awaiting approval. The codes of ``ExitCode`` stay the
command's own failures (2: bad input, e.g. a key already used for other arguments)."""
_WAIT_POLL_FIRST, _WAIT_POLL_MAX = 0.1, 1.0


def _operator_name() -> str:
    return os.environ.get("USER") or os.environ.get("USERNAME") or "operator"


async def _task_client(address: str | None) -> TaskClient:
    from onceflow.encryption import PayloadEncryptionSettings

    settings = load_settings()
    # Payloads written with keys are read with them: the same keys as the workers'.
    encryption = read_settings(PayloadEncryptionSettings)
    client = await connect_temporal(address=address, encryption=encryption)
    return TaskClient(client, task_queue=settings.task_queue)


@app.command()
def worker(temporal_address: TemporalAddress = None) -> None:
    """Run a worker until SIGTERM/SIGINT, then drain running activities and exit.

    It never joins a dev stack it finds on the machine: DATABASE_URL, STRIPE_API_KEY,
    DEPLOY_TARGET_URL come from its configuration (`source .onceflow/dev.env` to join a
    running `onceflow dev`).
    """
    from onceflow.cli._configuration import loaded_configuration
    from onceflow.worker import serve_worker

    settings, database_url = settings_and_database()
    configuration = loaded_configuration()

    async def body() -> None:
        stop, ready = asyncio.Event(), asyncio.Event()
        stop_on_signals(stop, ready=ready)

        def announce() -> None:
            ready.set()
            console.print(
                f"onceflow worker ready on task queue {settings.task_queue} (pid {os.getpid()})"
            )

        await reach_database(database_url)
        async with process_telemetry("onceflow-worker"):
            await serve_worker(
                configuration,
                database_url=database_url,
                stop=stop,
                temporal_address=temporal_address,
                on_ready=announce,
            )
        console.print("onceflow worker stopped")

    operate(body)


@app.command()
def relay() -> None:
    """Run an email outbox relay until SIGTERM/SIGINT, delivering to SMTP_URL.

    Run as many as you like: each armed email is claimed by one relay at a time.
    """
    from onceflow.cli._configuration import loaded_configuration
    from onceflow.email import EmailSettings, serve_relay

    settings, database_url = settings_and_database()
    email = loaded_configuration().read(EmailSettings)
    if email.smtp_url is None:
        raise CommandFailed(
            "SMTP_URL is not set; fix: set it to your SMTP relay (smtp://host:587 or "
            "smtps://user:password@host:465), or to join a running `onceflow dev`: "
            "source .onceflow/dev.env",
            exit_code=ExitCode.BAD_INPUT,
        )

    async def body() -> None:
        stop, ready = asyncio.Event(), asyncio.Event()
        stop_on_signals(stop, ready=ready)
        await reach_database(database_url)
        ready.set()
        async with process_telemetry("onceflow-relay"):
            await serve_relay(
                email,
                database_url=database_url,
                stop=stop,
                on_ready=lambda running: console.print(
                    f"onceflow relay {running.relay_id} ready, delivering to "
                    f"{running.server.describe()} (pid {os.getpid()})",
                    highlight=False,
                    soft_wrap=True,
                ),
            )
        console.print("onceflow relay stopped")

    operate(body)


@app.command()
def call(
    tool: Annotated[str, typer.Argument(help="Tool name, e.g. issue_coupon.")],
    tenant: Annotated[str, typer.Option(help="Tenant the task belongs to.")],
    key: Annotated[str, typer.Option(help="Idempotency key of this logical call.")],
    args: Annotated[str, typer.Option("--args", help="Tool arguments as a JSON object.")] = "{}",
    principal: Annotated[str, typer.Option(help="Who is calling.")] = "cli",
    wait: Annotated[
        bool,
        typer.Option(
            help="Wait until the task succeeds, fails, parks or awaits approval; exit 0, 3, "
            "4 or 5 accordingly."
        ),
    ] = False,
    deliberate_repeat: Annotated[
        bool,
        typer.Option(
            help="Make a second effect identical to an earlier call's on purpose (recorded). "
            "Without it, a call of the same intent as an earlier one, under any key, is "
            "answered by that call."
        ),
    ] = False,
    temporal_address: TemporalAddress = None,
) -> None:
    """Call one tool as a one-step task; the same key and arguments return the same task.

    The same key with other arguments is refused (exit 2), as the gateway refuses it
    (422). With --wait the exit code is the task's state: 0 succeeded, 3 failed,
    4 parked, 5 awaiting approval. With the ``OTEL_*`` variables set the call is traced
    like a gateway request: the task's trace starts at its ``cli.call`` span and its id
    is in the task's memo.
    """

    from onceflow.cli._configuration import loaded_configuration

    register_configured_tools(loaded_configuration())

    async def body() -> None:
        task = _one_step_task(tool, tenant, principal, key, args, deliberate_repeat)
        workflow_id = derive_task_workflow_id(tenant=tenant, scope=tool, idempotency_key=key)
        # Before the first client: it carries the tracing interceptor and its runtime the
        # metrics; leaving flushes the spans before the command exits.
        async with process_telemetry("onceflow-cli"):
            client = await _task_client(temporal_address)
            with boundary_span(
                f"cli.call {tool}",
                {
                    "onceflow.tenant": tenant,
                    "onceflow.principal": principal,
                    "onceflow.tool": tool,
                    "onceflow.key_digest": key_digest(key),
                    "onceflow.workflow_id": workflow_id,
                },
            ):
                await _start_or_join(client, task, workflow_id)
            if wait:
                status = await _until_settled(client, workflow_id)
            else:
                status = await client.status(workflow_id)
        console.print_json(status.model_dump_json())
        if wait and WAIT_EXIT_CODES[status.state]:
            raise typer.Exit(WAIT_EXIT_CODES[status.state])

    operate(body)


async def _start_or_join(client: TaskClient, task: AgentTaskInput, workflow_id: str) -> None:
    """Start the call's task, or join the one its key started for the same request.

    The fingerprint goes into the task's memo exactly as the gateway keeps it, so the
    same key with other arguments (or another principal) is refused instead of
    silently answered with the earlier task.
    """
    from onceflow.gateway import KEY_REUSED_DETAIL, request_fingerprint
    from onceflow.idempotency import REQUEST_HASH_MEMO

    [step] = task.steps
    fingerprint = request_fingerprint(
        operation="tools.call",
        scope=f"{task.tenant}:{task.principal}:{step.tool}:cli",
        route=f"onceflow call {step.tool}"
        + (" --deliberate-repeat" if step.deliberate_repeat else ""),
        body=step.arguments,
    )
    handle = await client.start(
        task, workflow_id=workflow_id, memo={REQUEST_HASH_MEMO: fingerprint}
    )
    started_by = (await (await handle.describe()).memo()).get(REQUEST_HASH_MEMO)
    if started_by is None:
        # Started before the CLI kept fingerprints: compare what the task was given.
        existing = await client.status(workflow_id)
        [first] = existing.steps
        same = existing.principal == task.principal and first.arguments == step.arguments
    else:
        same = started_by == fingerprint
    if not same:
        raise CommandFailed(KEY_REUSED_DETAIL, exit_code=ExitCode.BAD_INPUT)


async def _until_settled(client: TaskClient, workflow_id: str) -> TaskStatus:
    """The task's status once it ended, parked or awaits a person (it may wait for days)."""
    pause = _WAIT_POLL_FIRST
    while True:
        status = await client.status(workflow_id)
        if status.state in WAIT_EXIT_CODES:
            return status
        await asyncio.sleep(pause)
        pause = min(pause * 2, _WAIT_POLL_MAX)


def _one_step_task(
    tool: str, tenant: str, principal: str, key: str, raw: str, deliberate_repeat: bool
) -> AgentTaskInput:
    try:
        check_idempotency_key(key)
    except MalformedIdempotencyKey as malformed:
        raise CommandFailed(str(malformed), exit_code=ExitCode.BAD_INPUT) from None
    try:
        arguments: Any = json.loads(raw)
    except json.JSONDecodeError as error:
        raise CommandFailed(
            f"--args is not valid JSON: {error}", exit_code=ExitCode.BAD_INPUT
        ) from None
    if not isinstance(arguments, dict):
        raise CommandFailed("--args must be a JSON object", exit_code=ExitCode.BAD_INPUT)
    contract = CATALOGUE.get(tool)
    # Validated before anything starts, and normalized as the gateway does (defaults
    # filled in), so both fingerprint the same arguments the same way.
    normalized = contract.input_model.model_validate(arguments).model_dump(mode="json")
    if deliberate_repeat and not contract.deliberate_repeats:
        raise CommandFailed(
            f"tool {tool!r} does not allow deliberate repeats", exit_code=ExitCode.BAD_INPUT
        )
    step = StepInput(
        step_id="1", tool=tool, arguments=normalized, deliberate_repeat=deliberate_repeat
    )
    return AgentTaskInput(tenant=tenant, principal=principal, steps=[step])


@app.command()
def status(
    task_id: TaskId,
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
    temporal_address: TemporalAddress = None,
) -> None:
    """Show a task: its state, every step's attempts, evidence and the budget spent."""

    async def body() -> None:
        client = await _task_client(temporal_address)
        current = await client.status(task_id)
        if as_json:
            console.print_json(current.model_dump_json())
        else:
            render_status(console, current)

    operate(body)


@app.command()
def tasks(
    state: Annotated[TaskState | None, typer.Option(help="Only tasks in this state.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's tasks.")] = None,
    open_only: Annotated[
        bool, typer.Option("--open", help="Only open tasks (an agent's calls one by one).")
    ] = False,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the tasks as a JSON list.")
    ] = False,
    temporal_address: TemporalAddress = None,
) -> None:
    """List tasks, newest first, e.g. ``--state parked`` for those awaiting a decision."""

    async def body() -> None:
        client = await _task_client(temporal_address)
        found = [
            task
            async for task in client.list(
                state=state, tenant=tenant, open_only=open_only, limit=limit
            )
        ]
        if as_json:
            console.print_json(task_list_json(found))
        else:
            render_task_list(console, found)

    operate(body)


@app.command()
def reconcile(
    task_id: TaskId,
    step: Annotated[str, typer.Option(help="The parked step.")],
    decision: Annotated[ReconcileDecision, typer.Option(help="What you found.")],
    reason: Annotated[str, typer.Option(help="Why; recorded with the decision.")],
    resource_id: Annotated[
        str | None, typer.Option(help="With 'happened': the id of the effect you found.")
    ] = None,
    unverified: Annotated[
        bool,
        typer.Option(
            help="With 'happened': accept --resource-id although the tool's look-up "
            "cannot confirm it; with 'did_not_happen': although its miss does not prove "
            "the effect absent (recorded as unverified)."
        ),
    ] = False,
    operator: Annotated[str | None, typer.Option(help="Who decides (default: $USER).")] = None,
    temporal_address: TemporalAddress = None,
) -> None:
    """Decide a parked step: happened (with --resource-id), did_not_happen, or abandon.

    The task checks the decision with the tool's look-up first: did_not_happen is
    refused when the effect is found, happened when the id is not the step's effect.
    """

    async def body() -> None:
        finding = ReconcileInput(
            step_id=step,
            decision=decision,
            reason=reason,
            resource_id=resource_id,
            unverified=unverified,
            operator=operator or _operator_name(),
        )
        client = await _task_client(temporal_address)
        _print_decision(await client.reconcile(task_id, finding))

    operate(body)


@app.command()
def approve(
    task_id: TaskId,
    step: Annotated[str, typer.Option(help="The step awaiting approval.")],
    approved: Annotated[
        bool, typer.Option("--approve/--deny", help="Approve or deny the step's arguments.")
    ],
    reason: Annotated[str, typer.Option(help="Why; recorded with the decision.")],
    approver: Annotated[str | None, typer.Option(help="Who decides (default: $USER).")] = None,
    temporal_address: TemporalAddress = None,
) -> None:
    """Approve or deny a step's exact arguments (shown first) before its first attempt."""

    async def body() -> None:
        client = await _task_client(temporal_address)
        current = await client.status(task_id)
        try:
            waiting = current.step(step)
        except KeyError:
            raise CommandFailed(f"task {task_id} has no step {step!r}") from None
        if waiting.state is StepState.AWAITING_APPROVAL:
            verdict = "approving" if approved else "denying"
            errors.print(f"{verdict} {waiting.tool} with {waiting.arguments}", highlight=False)
        # Sent even when the step is not waiting: the task tells a repeat of the decision
        # it already took (answered with that one) from a conflict or a refusal.
        answer = await client.approve(
            task_id,
            ApproveInput(
                step_id=step,
                approved=approved,
                approver=approver or _operator_name(),
                reason=reason,
                arguments_digest=waiting.arguments_digest,
            ),
        )
        _print_decision(answer)

    operate(body)


def _print_decision(answer: DecisionAnswer) -> None:
    if answer.replayed:
        console.print(f"already decided: {answer.message}", highlight=False, soft_wrap=True)
    else:
        console.print(f"accepted: {answer.message}", highlight=False, soft_wrap=True)


@app.command()
def migrate() -> None:
    """Apply database migrations to DATABASE_URL (the stack does this on start).

    Prints what it applied and the schema version; a number no migration holds is named
    with the reason (numbers are never reused, so a gap is not a failed migration).
    """
    from onceflow.storage import apply_migrations

    settings = load_settings()
    if not settings.database_url:
        raise CommandFailed(
            "DATABASE_URL is not set; fix: set it to the PostgreSQL to migrate",
            exit_code=ExitCode.BAD_INPUT,
        )
    database_url = settings.database_url

    async def body() -> None:
        status = await apply_migrations(database_url)
        console.print(status.describe(), highlight=False, soft_wrap=True)

    operate(body)


register_boundary_commands(app, operate)  # gateway, mcp, principal
register_configuration_commands(app)  # --config, config check|show, the start-up check
register_tool_commands(app)  # tools
register_audit_command(app)  # audit
register_provider_commands(app, _operator_name)  # provider status|pause|resume
register_plugin_commands(app)  # dev, demo, local-stripe: from the dev stack when installed


def run(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    try:
        app(args=argv)
    except (CommandFailed, InvalidSettings) as failure:  # raised outside operate
        explained = explain(failure)
        print_failure(explained)
        raise SystemExit(explained.exit_code) from None


if __name__ == "__main__":
    run()
