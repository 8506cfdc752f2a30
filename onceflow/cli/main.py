"""``onceflow``: run the embedded stack and workers, call tools, inspect and decide tasks.

Every command fails with one line on standard error and a non-zero exit: 2 for bad
input, 1 for anything else. Machine-readable output (``call``, ``status --json``) is JSON
on standard output.
"""

import asyncio
import json
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from onceflow.cli._boundary import register as register_boundary_commands
from onceflow.cli._configuration import register as register_configuration_commands
from onceflow.cli._failures import CommandFailed, explain
from onceflow.cli._render import render_status, render_task_list
from onceflow.cli._services import register_configured_tools, settings_and_database
from onceflow.cli._tools import register as register_tool_commands
from onceflow.settings import InvalidSettings, load_settings
from onceflow.task_api import TaskClient, connect_temporal
from onceflow.telemetry import process_telemetry
from onceflow.tools import CATALOGUE, check_idempotency_key, derive_task_workflow_id
from onceflow.workflows.task_models import (
    AgentTaskInput,
    ApproveInput,
    ReconcileDecision,
    ReconcileInput,
    StepInput,
    StepState,
    TaskState,
)

app = typer.Typer(
    name="onceflow",
    help="Durable, retry-safe agent tool calls on Temporal.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
errors = Console(stderr=True)
T = TypeVar("T")

TaskId = Annotated[str, typer.Argument(help="The task's workflow id.")]
TemporalAddress = Annotated[
    str | None,
    typer.Option(help="Temporal frontend host:port (default: TEMPORAL_ADDRESS or localhost:7233)."),
]


def _operate(action: Callable[[], Awaitable[T]]) -> T:
    """Run one command's async body, turning any failure into one line and an exit code."""
    try:
        return _run_to_completion(action())
    except typer.Exit:
        raise
    except asyncio.CancelledError:
        errors.print("stopped before it was ready")
        raise typer.Exit(130) from None
    except Exception as error:  # the one place every failure is phrased for the operator
        failure = explain(error)
        _print_failure(failure)
        raise typer.Exit(failure.exit_code) from None


def _print_failure(failure: CommandFailed) -> None:
    """One ``error:`` line per problem; escaped, as settings problems name [tables]."""
    for line in str(failure).splitlines() or [""]:
        errors.print(f"[red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)


def _run_to_completion(main: Awaitable[T]) -> T:
    """Like ``asyncio.run``, but leftovers get a bounded time to end after ``main`` does.

    A client still polling a server that has gone away may never finish cancelling;
    ``asyncio.run`` would wait for it forever and Ctrl-C would never return the prompt.
    """
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(main)
    finally:
        leftovers = asyncio.all_tasks(loop)
        for task in leftovers:
            task.cancel()
        if leftovers:
            loop.run_until_complete(asyncio.wait(leftovers, timeout=10))
        loop.close()


def _operator_name() -> str:
    return os.environ.get("USER") or os.environ.get("USERNAME") or "operator"


async def _task_client(address: str | None) -> TaskClient:
    settings = load_settings()
    return TaskClient(await connect_temporal(address=address), task_queue=settings.task_queue)


def _stop_on_signals(stop: asyncio.Event, *, ready: asyncio.Event | None = None) -> None:
    """SIGINT/SIGTERM set ``stop``; before ``ready`` is set they abort start-up instead."""
    loop = asyncio.get_running_loop()
    starting = asyncio.current_task()

    def on_signal() -> None:
        if ready is not None and not ready.is_set() and starting is not None:
            starting.cancel()  # leaves each started service's cleanup to run
        stop.set()

    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(stop_signal, on_signal)


@app.command()
def dev(
    temporal_port: Annotated[int, typer.Option(help="Temporal gRPC port.")] = 7233,
    ui_port: Annotated[int, typer.Option(help="Temporal Web UI port.")] = 8233,
) -> None:
    """Run the embedded stack in the foreground until Ctrl-C: PostgreSQL, Temporal, a worker."""
    from onceflow_devstack.stack import embedded_stack

    async def body() -> None:
        stop, ready = asyncio.Event(), asyncio.Event()
        _stop_on_signals(stop, ready=ready)
        async with (
            process_telemetry("onceflow-dev"),
            embedded_stack(
                load_settings(),
                temporal_port=temporal_port,
                ui_port=ui_port,
                progress=lambda message: errors.print(f"[dim]… {message}[/]"),
            ) as stack,
        ):
            ready.set()
            console.print("[bold green]onceflow dev stack is running[/]")
            for what, where in stack.describe():
                console.print(f"  {what:<26} {where}", highlight=False, soft_wrap=True)
            console.print("Press Ctrl-C to stop.")
            await stop.wait()
        console.print("stopped cleanly")

    _operate(body)


@app.command()
def worker(temporal_address: TemporalAddress = None) -> None:
    """Run a worker until SIGTERM/SIGINT, then drain running activities and exit.

    Without DATABASE_URL, STRIPE_API_KEY or DEPLOY_TARGET_URL it joins the services of
    the embedded stack last started from ONCEFLOW_STATE_DIR.
    """
    from onceflow_devstack.email_deploy_services import running_stack_deploy_target_url
    from onceflow_devstack.stack import LOCAL_PROVIDER_KEY, running_stack_provider_url
    from pydantic import SecretStr

    from onceflow.deployments import DeployTargetSettings
    from onceflow.payments import StripeSettings
    from onceflow.settings import read_settings
    from onceflow.worker import serve_worker

    settings, database_url = settings_and_database()
    stripe = read_settings(StripeSettings)
    local_provider = running_stack_provider_url(settings.state_dir)
    if not (stripe.api_base or stripe.configured) and local_provider:
        stripe = stripe.model_copy(
            update={"api_key": SecretStr(LOCAL_PROVIDER_KEY), "api_base": local_provider}
        )
    deploy_target = read_settings(DeployTargetSettings)
    local_target = running_stack_deploy_target_url(settings.state_dir)
    if deploy_target.url is None and local_target:
        deploy_target = deploy_target.model_copy(update={"url": local_target})

    async def body() -> None:
        stop, ready = asyncio.Event(), asyncio.Event()
        _stop_on_signals(stop, ready=ready)

        def announce() -> None:
            ready.set()
            console.print(
                f"onceflow worker ready on task queue {settings.task_queue} (pid {os.getpid()})"
            )

        async with process_telemetry("onceflow-worker"):
            await serve_worker(
                settings,
                database_url=database_url,
                stop=stop,
                temporal_address=temporal_address,
                on_ready=announce,
                stripe=stripe,
                deploy_target=deploy_target,
            )
        console.print("onceflow worker stopped")

    _operate(body)


@app.command()
def relay() -> None:
    """Run an email outbox relay until SIGTERM/SIGINT, delivering to SMTP_URL.

    Run as many as you like: each armed email is claimed by one relay at a time.
    """
    from onceflow_devstack.email_deploy_services import running_stack_smtp_url

    from onceflow.email import EmailSettings, serve_relay

    settings, database_url = settings_and_database()
    email = EmailSettings()
    if email.smtp_url is None:
        recorded = running_stack_smtp_url(settings.state_dir)
        if recorded is None:
            raise CommandFailed("SMTP_URL is not set and no embedded stack runs an SMTP sink")
        email = email.model_copy(update={"smtp_url": recorded})

    async def body() -> None:
        stop = asyncio.Event()
        _stop_on_signals(stop)
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

    _operate(body)


@app.command()
def call(
    tool: Annotated[str, typer.Argument(help="Tool name, e.g. issue_coupon.")],
    tenant: Annotated[str, typer.Option(help="Tenant the task belongs to.")],
    key: Annotated[str, typer.Option(help="Idempotency key of this logical call.")],
    args: Annotated[str, typer.Option("--args", help="Tool arguments as a JSON object.")] = "{}",
    principal: Annotated[str, typer.Option(help="Who is calling.")] = "cli",
    wait: Annotated[bool, typer.Option(help="Wait for the task to end.")] = False,
    temporal_address: TemporalAddress = None,
) -> None:
    """Call one tool as a one-step task; the same key returns the same task."""

    register_configured_tools(load_settings())

    async def body() -> None:
        task = _one_step_task(tool, tenant, principal, key, args)
        workflow_id = derive_task_workflow_id(tenant=tenant, scope=tool, idempotency_key=key)
        client = await _task_client(temporal_address)
        await client.start(task, workflow_id=workflow_id)
        if wait:
            status = await client.result(workflow_id)
        else:
            status = await client.status(workflow_id)
        console.print_json(status.model_dump_json())

    _operate(body)


def _one_step_task(tool: str, tenant: str, principal: str, key: str, raw: str) -> AgentTaskInput:
    try:
        check_idempotency_key(key)
    except ValueError as malformed:
        raise CommandFailed(str(malformed), exit_code=2) from None
    try:
        arguments: Any = json.loads(raw)
    except json.JSONDecodeError as error:
        raise CommandFailed(f"--args is not valid JSON: {error}", exit_code=2) from None
    if not isinstance(arguments, dict):
        raise CommandFailed("--args must be a JSON object", exit_code=2)
    contract = CATALOGUE.get(tool)
    contract.input_model.model_validate(arguments)  # reject before anything starts
    return AgentTaskInput(
        tenant=tenant,
        principal=principal,
        steps=[StepInput(step_id="1", tool=tool, arguments=arguments)],
    )


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

    _operate(body)


@app.command()
def tasks(
    state: Annotated[TaskState | None, typer.Option(help="Only tasks in this state.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's tasks.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    temporal_address: TemporalAddress = None,
) -> None:
    """List tasks, newest first, e.g. ``--state parked`` for those awaiting a decision."""

    async def body() -> None:
        client = await _task_client(temporal_address)
        found = [task async for task in client.list(state=state, tenant=tenant, limit=limit)]
        render_task_list(console, found)

    _operate(body)


@app.command()
def reconcile(
    task_id: TaskId,
    step: Annotated[str, typer.Option(help="The parked step.")],
    decision: Annotated[ReconcileDecision, typer.Option(help="What you found.")],
    reason: Annotated[str, typer.Option(help="Why; recorded with the decision.")],
    resource_id: Annotated[
        str | None, typer.Option(help="With 'happened': the id of the effect you found.")
    ] = None,
    operator: Annotated[str | None, typer.Option(help="Who decides (default: $USER).")] = None,
    temporal_address: TemporalAddress = None,
) -> None:
    """Decide a parked step: happened (with --resource-id), did_not_happen, or abandon."""

    async def body() -> None:
        finding = ReconcileInput(
            step_id=step,
            decision=decision,
            reason=reason,
            resource_id=resource_id,
            operator=operator or _operator_name(),
        )
        client = await _task_client(temporal_address)
        result = await client.reconcile(task_id, finding)
        console.print(f"accepted: {result.message}")

    _operate(body)


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
        if waiting.state is not StepState.AWAITING_APPROVAL:
            raise CommandFailed(
                f"step {step!r} is not awaiting approval (it is {waiting.state.value})"
            )
        verdict = "approving" if approved else "denying"
        errors.print(f"{verdict} {waiting.tool} with {waiting.arguments}", highlight=False)
        result = await client.approve(
            task_id,
            ApproveInput(
                step_id=step,
                approved=approved,
                approver=approver or _operator_name(),
                reason=reason,
                arguments_digest=waiting.arguments_digest,
            ),
        )
        console.print(f"accepted: {result.message}")

    _operate(body)


@app.command()
def migrate() -> None:
    """Apply database migrations to DATABASE_URL (the stack does this on start)."""
    from onceflow.storage import apply_migrations

    settings = load_settings()
    if not settings.database_url:
        raise CommandFailed("DATABASE_URL is not set")
    database_url = settings.database_url

    async def body() -> None:
        applied = await apply_migrations(database_url)
        console.print(f"applied migrations: {applied or 'none (up to date)'}")

    _operate(body)


@app.command()
def provider(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind; 0 picks a free one.")] = 12111,
    key_retention_seconds: Annotated[
        float, typer.Option(help="How long an idempotency key is honoured (Stripe: ~24 h).")
    ] = 86400.0,
    search_lag_seconds: Annotated[
        float, typer.Option(help="Delay before a new object appears in search results.")
    ] = 0.0,
) -> None:
    """Run the local Stripe-compatible provider (prints its URL for STRIPE_API_BASE)."""
    from onceflow_devstack.stripe_provider import serve

    serve(
        host=host,
        port=port,
        key_retention_seconds=key_retention_seconds,
        search_lag_seconds=search_lag_seconds,
    )


@app.command()
def demo(
    temporal_port: Annotated[int, typer.Option(help="Temporal gRPC port.")] = 7233,
    ui_port: Annotated[int, typer.Option(help="Temporal Web UI port.")] = 8233,
) -> None:
    """Run a short scripted agent task end to end on the embedded stack and explain it."""
    from onceflow_devstack.demo import run_demo

    _operate(lambda: run_demo(load_settings(), console, temporal_port, ui_port))


register_boundary_commands(app, _operate)  # gateway, mcp, principal
register_configuration_commands(app)  # --config, config check|show, the start-up check
register_tool_commands(app)  # tools


def run(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    try:
        app(args=argv)
    except (CommandFailed, InvalidSettings) as failure:  # raised outside _operate
        explained = explain(failure)
        _print_failure(explained)
        raise SystemExit(explained.exit_code) from None


if __name__ == "__main__":
    run()
