"""The email and deployment part of ``onceflow demo``.

First the agent sends an order confirmation: the email and its outbox row commit
together, the stack's relay delivers it over SMTP with the event id as ``Message-ID``,
and the local SMTP sink shows what it received. Then the agent asks for a production
deployment: it waits for a person, the demo approves the exact arguments through the
task's ``approve`` Update, and the deployment runs under a lease whose fencing token the
deployment target records on every write.
"""

import asyncio
import uuid
from typing import Any

import httpx
import psycopg
from rich.console import Console

from onceflow.task_api import TaskClient
from onceflow.tools.worker import derive_task_workflow_id
from onceflow.workflows.task_models import (
    AgentTaskInput,
    ApproveInput,
    StepInput,
    TaskState,
    TaskStatus,
)


async def email_and_deploy_scenario(
    console: Console,
    client: TaskClient,
    *,
    database_url: str,
    deploy_target_url: str | None,
    smtp_sink_control_url: str | None = None,
    tenant: str = "acme",
    ui_url: str | None = None,
    first_section: int = 7,
) -> None:
    """Show one email delivered through the outbox and one approved deployment.

    Args:
        console: Where to explain.
        client: Starts, approves and reads tasks on the stack's task queue.
        database_url: The stack's database, to show the outbox and deployment rows.
        deploy_target_url: The deployment target the stack's worker writes to (its
            record of writes is shown when it is the local one); None skips its record.
        smtp_sink_control_url: The local SMTP sink's side door, to show what it
            received; None for an external SMTP server.
        tenant: Tenant of the demo tasks.
        ui_url: The Temporal Web UI, to link the tasks; None prints no link.
        first_section: Number of the first section heading.
    """
    await _email(console, client, database_url, smtp_sink_control_url, tenant, first_section)
    await _deployment(
        console, client, database_url, deploy_target_url, tenant, ui_url, first_section + 1
    )


async def _email(
    console: Console,
    client: TaskClient,
    database_url: str,
    sink_url: str | None,
    tenant: str,
    section: int,
) -> None:
    console.rule(f"{section}. The agent emails an order confirmation through the outbox")
    order = f"ord-{uuid.uuid4().hex[:6]}"
    workflow_id = await _start(
        client,
        tenant,
        f"confirm-{order}",
        StepInput(
            step_id="mail",
            tool="send_email",
            arguments={
                "to": ["ada@example.com"],
                "subject": f"Your order {order} is confirmed",
                "body": f"Thank you! Order {order} ships tomorrow.",
            },
        ),
    )
    status = await client.result(workflow_id)
    step = status.step("mail")
    console.print(
        f"  mail  send_email  {step.state.value}  attempts: "
        f"{', '.join(a.outcome.value for a in step.attempts)}",
        highlight=False,
    )
    message_id = step.result.get("message_id") or step.evidence.get("message_id", "")
    console.print(
        f"The email and its outbox row committed in one transaction; relay "
        f"[bold]{step.result.get('relay')}[/] delivered it with Message-ID {message_id} "
        f"and the server answered {step.result.get('smtp_reply')!r}.",
        soft_wrap=True,
        highlight=False,
    )
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cursor = await conn.execute(
            "SELECT d.relay_id, d.outcome FROM email_deliveries d"
            " JOIN email_messages m USING (event_id) WHERE m.message_id = %s"
            " ORDER BY d.delivery_id",
            (message_id,),
        )
        delivered = await cursor.fetchall()
    console.print(f"  deliveries recorded in the outbox: {delivered}", highlight=False)
    if sink_url is not None:
        received = [
            message
            for message in (await _get_json(f"{sink_url}/messages")).get("received", [])
            if message.get("message_id") == message_id
        ]
        for message in received:
            console.print(
                f"  the SMTP sink received: To {', '.join(message['rcpt_tos'])}  "
                f"Subject {message['subject']!r}  applied={message['applied']}",
                highlight=False,
            )
        console.print(
            f"A relay that died mid-delivery would leave its claim to expire; the relay "
            f"taking it over would send nothing if the message may have passed DATA (the "
            f"step parks for an operator), and deliver it if it had not begun sending "
            f"(the sink has applied this one "
            f"{sum(1 for m in received if m['applied'])} time).",
            soft_wrap=True,
        )


async def _deployment(
    console: Console,
    client: TaskClient,
    database_url: str,
    target_url: str | None,
    tenant: str,
    ui_url: str | None,
    section: int,
) -> None:
    console.rule(f"{section}. The agent asks for a deployment; a person approves it")
    version = f"2.4.{uuid.uuid4().int % 1000}"
    workflow_id = await _start(
        client,
        tenant,
        f"release-checkout-{version}",
        StepInput(
            step_id="deploy",
            tool="start_deployment",
            arguments={"service": "checkout", "version": version, "environment": "production"},
        ),
    )
    waiting = await _until(client, workflow_id, TaskState.AWAITING_APPROVAL)
    step = waiting.step("deploy")
    console.print(
        f"The task waits: [bold]{waiting.state.value}[/] for {step.tool} with "
        f"{step.arguments} (digest {step.arguments_digest[:23]}…). Nothing was deployed.",
        soft_wrap=True,
        highlight=False,
    )
    decision = await client.approve(
        workflow_id,
        ApproveInput(
            step_id="deploy",
            approved=True,
            approver="release-manager",
            reason="demo: change ticket CHG-1042",
            arguments_digest=step.arguments_digest,
        ),
    )
    console.print(f"Approved through the task's approve Update: {decision.message}.")
    status = await client.result(workflow_id)
    done = status.step("deploy")
    console.print(
        f"  deploy  start_deployment  {done.state.value}  attempts: "
        f"{', '.join(a.outcome.value for a in done.attempts)}  "
        f"fencing token {done.result.get('fencing_token')}",
        highlight=False,
    )
    deployment_id = done.resource_id or ""
    if target_url is not None:
        record = await _get_json(f"{target_url}/deployments/{deployment_id}")
        for deployment in record.get("deployments", []):
            for write in deployment.get("writes", []):
                console.print(
                    f"  target: {write['step']:<9} token {write['fencing_token']}  "
                    f"{'applied' if write['applied'] else 'refused (stale token)'}",
                    highlight=False,
                )
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cursor = await conn.execute(
            "SELECT state, fencing_token, steps_done FROM deployments WHERE deployment_id = %s",
            (deployment_id,),
        )
        row = await cursor.fetchone()
    console.print(
        f"One deployment recorded: state {row[0] if row else '?'}, token "
        f"{row[1] if row else '?'}, {row[2] if row else '?'} steps. A worker that paused past "
        "its lease would find its token refused by the target and by this row.",
        soft_wrap=True,
    )
    if ui_url is not None:
        console.print(
            f"Deployment task in the UI: {ui_url}/namespaces/default/workflows/{workflow_id}",
            soft_wrap=True,
        )


async def _start(client: TaskClient, tenant: str, key: str, step: StepInput) -> str:
    workflow_id = derive_task_workflow_id(tenant=tenant, scope="task", idempotency_key=key)
    await client.start(
        AgentTaskInput(tenant=tenant, principal="demo-agent", steps=[step]),
        workflow_id=workflow_id,
    )
    return workflow_id


async def _until(client: TaskClient, workflow_id: str, state: TaskState) -> TaskStatus:
    for _ in range(600):
        status = await client.status(workflow_id)
        if status.state is state:
            return status
        await asyncio.sleep(0.1)
    raise TimeoutError(f"task {workflow_id} did not reach {state.value} within a minute")


async def _get_json(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10.0) as http:
        response = await http.get(url)
        response.raise_for_status()
        body = response.json()
    return body if isinstance(body, dict) else {}
