"""``onceflow demo``: a short scripted agent task on the embedded stack, explained.

The agent welcomes a new customer (a coupon and a first order), then behaves like real
agents do: it retries the whole call after a timeout, and a second agent asks for the
same coupon. The database shows one coupon and one order all the same. Then a charge
whose response is lost (one charge at the provider), a charge that parks for a person,
an email through the outbox and an approved deployment.

``onceflow demo --agent`` runs the ``examples/support_agent`` scenario instead: a
PydanticAI agent, scripted offline, whose parked refund ends its run with deferred tool
requests until an operator reconciles it (``make demo-agent`` installs the example first).
"""

import uuid
from dataclasses import dataclass

import psycopg
from rich.console import Console

from onceflow.cli.plugin import CommandFailed
from onceflow.configuration import OnceflowConfiguration
from onceflow.encryption import PayloadEncryptionSettings, onceflow_data_converter
from onceflow.nexus import NexusPrincipal
from onceflow.task_api import TaskClient, connect_temporal
from onceflow.tools.worker import derive_task_workflow_id
from onceflow.workflows.task_models import AgentTaskInput, StepInput, TaskStatus
from onceflow_devstack.demo_email_deploy import email_and_deploy_scenario
from onceflow_devstack.demo_nexus import nexus_scenario
from onceflow_devstack.demo_payments import payments_scenario
from onceflow_devstack.email_deploy_services import (
    running_stack_deploy_target_url,
    running_stack_smtp_sink_control_url,
)
from onceflow_devstack.gateway import DEV_PRINCIPAL, DEV_TENANT, running_stack_gateway
from onceflow_devstack.ports import StackPorts
from onceflow_devstack.stack import (
    StackAlreadyRunning,
    embedded_stack,
    running_stack_database_url,
    running_stack_provider_url,
    running_stack_temporal,
)


@dataclass(frozen=True)
class _Endpoints:
    temporal_address: str
    database_url: str
    ui_url: str
    task_queue: str
    local_provider_url: str | None = None
    local_deploy_target_url: str | None = None
    smtp_sink_control_url: str | None = None
    encryption: PayloadEncryptionSettings | None = None
    """The stack's payload keys: the demo's client reads what its worker encrypted."""
    nexus_principal: str | None = None
    """The principal the stack's Nexus service acts as (``TENANT/NAME``)."""


async def run_demo(
    configuration: OnceflowConfiguration, console: Console, temporal_port: int, ui_port: int
) -> None:
    """Run the demo on a running ``onceflow dev`` stack, or on one started for it."""
    settings = configuration.onceflow
    entered = False
    try:
        async with embedded_stack(
            configuration,
            ports=StackPorts(temporal=temporal_port, ui=ui_port),
            progress=lambda message: console.print(f"[dim]… {message}[/]"),
        ) as stack:
            entered = True
            services = stack.email_and_deploy
            await _scenario(
                console,
                _Endpoints(
                    stack.temporal_address,
                    stack.database_url,
                    stack.ui_url,
                    stack.task_queue,
                    local_provider_url=(
                        stack.payment_provider_url if stack.payment_provider_is_local else None
                    ),
                    local_deploy_target_url=(
                        services.deploy_target.url
                        if services and services.deploy_target_is_local
                        else None
                    ),
                    smtp_sink_control_url=services.smtp_sink_control_url if services else None,
                    encryption=configuration.payload_encryption,
                    nexus_principal=stack.nexus_principal,
                ),
            )
            console.print(
                "\nThe stack stops now; its state stays in "
                f"{stack.state_dir}. Run [bold]onceflow dev[/] to browse these tasks in the UI."
            )
    except StackAlreadyRunning:
        if entered:
            raise
        database_url = running_stack_database_url(settings.state_dir)
        if database_url is None:
            raise
        console.print("[dim]… using the running `onceflow dev` stack[/]")
        temporal_address, ui_url = running_stack_temporal(settings.state_dir) or (
            f"127.0.0.1:{temporal_port}",
            f"http://localhost:{ui_port}",
        )
        await _scenario(
            console,
            _Endpoints(
                temporal_address,
                database_url,
                ui_url,
                settings.task_queue,
                local_provider_url=running_stack_provider_url(settings.state_dir),
                local_deploy_target_url=running_stack_deploy_target_url(settings.state_dir),
                smtp_sink_control_url=running_stack_smtp_sink_control_url(settings.state_dir),
                encryption=configuration.payload_encryption,
                nexus_principal=settings.nexus_principal or f"{DEV_TENANT}/{DEV_PRINCIPAL}",
            ),
        )


AGENT_EXAMPLE_TOOLS = "support_agent.tools:TOOLS"
"""``examples/support_agent``'s ``look_up_order``, named by module so it loads once importable."""


async def run_agent_demo(
    configuration: OnceflowConfiguration, console: Console, temporal_port: int, ui_port: int
) -> None:
    """Run the support agent example's scripted run on a running ``onceflow dev`` stack
    (started with ``ONCEFLOW_TOOLS=support_agent``), or on one started for it."""
    try:
        # An example, installed on demand: not a dependency of the dev stack.
        from support_agent.demo import scripted_demo  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        raise CommandFailed(
            "the support agent example is not installed: run `make demo-agent`, or "
            "`.venv/bin/pip install ./examples/support_agent` and then `onceflow demo --agent`"
        ) from None
    settings = configuration.onceflow
    if not {AGENT_EXAMPLE_TOOLS, "support_agent"} & set(settings.tools):
        settings = settings.model_copy(update={"tools": (*settings.tools, AGENT_EXAMPLE_TOOLS)})
        configuration = configuration.model_copy(update={"onceflow": settings})

    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    entered = False
    try:
        async with embedded_stack(
            configuration,
            ports=StackPorts(temporal=temporal_port, ui=ui_port),
            progress=lambda message: console.print(f"[dim]… {message}[/]"),
        ) as stack:
            entered = True
            if not stack.payment_provider_is_local or stack.payment_provider_url is None:
                raise CommandFailed(
                    "the agent demo makes the local Stripe-compatible provider misbehave: "
                    "unset STRIPE_API_KEY and STRIPE_API_BASE"
                )
            assert stack.gateway_url is not None and stack.dev_api_key_file is not None
            services = stack.email_and_deploy
            await scripted_demo(
                gateway_url=stack.gateway_url,
                api_key=stack.dev_api_key_file.read_text().strip(),
                database_url=stack.database_url,
                provider_url=stack.payment_provider_url,
                temporal_address=stack.temporal_address,
                task_queue=stack.task_queue,
                sink_control_url=services.smtp_sink_control_url if services else None,
                say=say,
                section=console.rule,
            )
    except StackAlreadyRunning:
        if entered:
            raise
        gateway = running_stack_gateway(settings.state_dir)
        database_url = running_stack_database_url(settings.state_dir)
        provider_url = running_stack_provider_url(settings.state_dir)
        if gateway is None or database_url is None or provider_url is None:
            raise
        console.print(
            "[dim]… using the running `onceflow dev` stack (start it with "
            "ONCEFLOW_TOOLS=support_agent)[/]"
        )
        recorded = running_stack_temporal(settings.state_dir)
        await scripted_demo(
            gateway_url=gateway[0],
            api_key=gateway[1],
            database_url=database_url,
            provider_url=provider_url,
            temporal_address=recorded[0] if recorded else f"127.0.0.1:{temporal_port}",
            task_queue=settings.task_queue,
            sink_control_url=running_stack_smtp_sink_control_url(settings.state_dir),
            say=say,
            section=console.rule,
        )


async def _scenario(console: Console, endpoints: _Endpoints) -> None:
    client = TaskClient(
        await connect_temporal(address=endpoints.temporal_address, encryption=endpoints.encryption),
        task_queue=endpoints.task_queue,
    )
    customer = f"u-{uuid.uuid4().hex[:6]}"
    welcome = AgentTaskInput(
        tenant="acme",
        principal="support-agent",
        steps=[
            StepInput(
                step_id="coupon",
                tool="issue_coupon",
                arguments={"user_id": customer, "coupon_id": "WELCOME10"},
            ),
            StepInput(
                step_id="order",
                tool="create_order",
                arguments={
                    "customer_id": customer,
                    "currency": "eur",
                    "lines": [{"sku": "mug-classic", "quantity": 2, "unit_price_cents": 1250}],
                },
            ),
        ],
    )
    agent_key = f"welcome-{customer}"
    task_id = derive_task_workflow_id(tenant="acme", scope="task", idempotency_key=agent_key)

    console.rule("1. The agent welcomes a new customer")
    await client.start(welcome, workflow_id=task_id)
    first = await client.result(task_id)
    _show(console, first)

    console.rule("2. The agent's call timed out on its side, so it sends the same call again")
    await client.start(welcome, workflow_id=task_id)
    again = await client.result(task_id)
    console.print(
        f"Same idempotency key → same task [bold]{task_id}[/], not run again: "
        f"order {again.step('order').resource_id} is the one from the first call "
        f"({sum(len(step.attempts) for step in again.steps)} attempts in all).",
        soft_wrap=True,
    )

    console.rule("3. A second agent asks for the same coupon under its own key")
    other_id = derive_task_workflow_id(
        tenant="acme", scope="task", idempotency_key=f"{agent_key}-b"
    )
    duplicate = welcome.model_copy(update={"principal": "sales-agent", "steps": welcome.steps[:1]})
    await client.start(duplicate, workflow_id=other_id)
    second = await client.result(other_id)
    result = second.step("coupon").result
    console.print(
        f"The unique constraint answers: already_issued={result.get('already_issued')}, "
        f"issuance {result.get('issuance_id')}."
    )

    console.rule("4. What the database holds")
    async with await psycopg.AsyncConnection.connect(endpoints.database_url) as conn:
        coupons = await (
            await conn.execute(
                "SELECT count(*) FROM coupon_issuances WHERE user_id = %s", (customer,)
            )
        ).fetchone()
        orders = await (
            await conn.execute("SELECT count(*) FROM orders WHERE customer_id = %s", (customer,))
        ).fetchone()
    console.print(
        f"coupons for {customer}: [bold]{coupons[0] if coupons else 0}[/]    "
        f"orders for {customer}: [bold]{orders[0] if orders else 0}[/]"
    )
    console.print(
        "\nOpen the task in the Temporal UI: "
        f"{endpoints.ui_url}/namespaces/default/workflows/{task_id}",
        soft_wrap=True,
    )
    console.print(f"Or in a terminal: onceflow status {task_id}", soft_wrap=True)

    if endpoints.local_provider_url is not None:
        await payments_scenario(
            console, client, endpoints.local_provider_url, ui_url=endpoints.ui_url
        )
    await email_and_deploy_scenario(
        console,
        client,
        database_url=endpoints.database_url,
        deploy_target_url=endpoints.local_deploy_target_url,
        smtp_sink_control_url=endpoints.smtp_sink_control_url,
        ui_url=endpoints.ui_url,
        first_section=7,
    )
    if endpoints.local_provider_url is not None and endpoints.nexus_principal is not None:
        await nexus_scenario(
            console,
            client,
            endpoints.local_provider_url,
            temporal_address=endpoints.temporal_address,
            principal=NexusPrincipal.parse(endpoints.nexus_principal),
            ui_url=endpoints.ui_url,
            first_section=9,
            data_converter=onceflow_data_converter(endpoints.encryption),
        )


def _show(console: Console, status: TaskStatus) -> None:
    for step in status.steps:
        attempts = ", ".join(attempt.outcome.value for attempt in step.attempts)
        console.print(
            f"  {step.step_id:<7} {step.tool:<13} {step.state.value:<10} "
            f"attempts: {attempts:<10} resource: {step.resource_id}"
        )
    console.print(f"  task state: [bold]{status.state.value}[/]")
