"""The production topology, started from parts exactly as the "Run it in production" page
(docs/production.md) says: its deploy block is parsed and each line run by ``bash`` as
written.

The test plays the operator's surroundings and nothing else: the Temporal dev server
stands in for the cluster, in a namespace created for this run (so the block's own
``temporal operator search-attribute create`` lines are what registers onceflow's search
attributes there), a database created for this run on the embedded PostgreSQL stands in
for the managed one (so ``onceflow migrate`` creates the schema), and an SMTP sink in this
process is the relays' far side. The block's settings come from the environment, under the
names the page documents.

Then, as an agent would: one ``issue_coupon`` call through the first gateway, the same
call (same ``Idempotency-Key``) through the second, and an email through the relay. The
evidence is on the far sides: one coupon row in PostgreSQL, one message at the SMTP sink,
the task's search attributes in Temporal, one attempt in the two workers' logs together.
"""

import asyncio
import os
import re
import shlex
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg
from google.protobuf.duration_pb2 import Duration
from onceflow_devstack.smtp_sink import RunningSink, running_smtp_sink
from psycopg import sql
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from onceflow.task_api import TaskClient
from onceflow.workflows.visibility import ALL_SEARCH_ATTRIBUTES, TASK_STATE, TASK_TENANT
from tests.harness import HANG_SECONDS, REPO, log_line

PAGE = REPO / "docs" / "production.md"
SECTION = "# Run it in production"
SERVICES = ("worker", "gateway", "relay", "mcp")
"""The long-running commands; every other line of the block runs once, to completion."""
STARTED = {"worker": 2, "gateway": 2}
"""How many of each service the test runs (one of any other the block names)."""
READY = {
    "worker": "onceflow worker ready on task queue ",
    "gateway": "onceflow gateway ready on ",
    "relay": " ready, delivering to ",
}
"""The line each service prints once it reached its settings, PostgreSQL and Temporal."""
SETTINGS_PREFIXES = ("TEMPORAL_", "ONCEFLOW_", "DATABASE_URL", "SMTP_URL", "STRIPE_", "DEPLOY_")
"""Inherited variables dropped, so only what the test supplies configures the processes."""
COUPON = {"user_id": "u-42", "coupon_id": "WELCOME10"}


@dataclass(frozen=True)
class Command:
    """One command of the deploy block, as the shell runs it."""

    line: str
    words: tuple[str, ...]

    @property
    def service(self) -> str | None:
        """``worker``, ``gateway``…: the ``onceflow`` service it starts, or None."""
        if self.words[:1] == ("onceflow",) and len(self.words) > 1:
            return self.words[1] if self.words[1] in SERVICES else None
        return None


def production_section() -> str:
    """The "Run it in production" page, whole: README's section of that name moved there."""
    text = PAGE.read_text()
    assert text.startswith(f"{SECTION}\n"), f"{PAGE} does not open with {SECTION!r}"
    return text


def deploy_block(section: str) -> list[Command]:
    """The commands of the section's ``sh`` block that runs ``onceflow migrate``."""
    blocks = re.findall(r"^```sh\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)
    [block] = [block for block in blocks if "onceflow migrate" in block]
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        words = tuple(shlex.split(line, comments=True))
        if words:
            commands.append(Command(line=line, words=words))
    return commands


@dataclass
class Service:
    """One long-running process started from a line of the block."""

    name: str
    process: asyncio.subprocess.Process
    log_path: Path

    def log(self) -> str:
        """Everything the process wrote so far."""
        return self.log_path.read_text(errors="replace")


async def test_the_documented_production_topology_runs_a_task_once_across_two_gateways(
    dev_server: WorkflowEnvironment, postgres_url: str, tmp_path: Path
) -> None:
    section = production_section()
    commands = deploy_block(section)
    one_shots = [command for command in commands if command.service is None]
    services = [command for command in commands if command.service is not None]
    assert {command.service for command in services} >= {"worker", "gateway", "relay"}
    assert ("onceflow", "migrate") in [command.words[:2] for command in one_shots]
    [principal] = [c.words for c in one_shots if c.words[:3] == ("onceflow", "principal", "add")]
    tenant = principal[principal.index("--tenant") + 1]

    namespace = f"onceflow-prod-{uuid.uuid4().hex[:8]}"
    await dev_server.client.workflow_service.register_namespace(
        RegisterNamespaceRequest(
            namespace=namespace, workflow_execution_retention_period=Duration(seconds=86_400)
        )
    )
    task_queue = f"prod-{uuid.uuid4().hex[:10]}"
    async with fresh_database(postgres_url) as database_url, running_smtp_sink() as sink:
        settings = {
            "TEMPORAL_ADDRESS": dev_server.client.service_client.config.target_host,
            "TEMPORAL_NAMESPACE": namespace,
            "DATABASE_URL": database_url,
            "ONCEFLOW_TASK_QUEUE": task_queue,
            # The tools whose services this test has (no Stripe, no deployment target).
            "ONCEFLOW_BUILTIN_TOOLS": "issue_coupon,create_order,send_email",
            "SMTP_URL": sink.smtp_url,
            "PORT": "0",  # two gateways on one host: each takes a free port
        }
        undocumented = [name for name in settings if name not in section]
        assert not undocumented, f"the section does not name {undocumented}"
        bin_dir = Path(sys.executable).parent  # onceflow's and temporal's console scripts
        assert (bin_dir / "onceflow").exists() and (bin_dir / "temporal").exists()
        env = {
            **{
                name: value
                for name, value in os.environ.items()
                if not name.startswith(SETTINGS_PREFIXES)
            },
            **settings,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
        }

        outputs = [await run_once(command, env, tmp_path) for command in one_shots]
        [api_key] = [
            output
            for command, output in zip(one_shots, outputs, strict=True)
            if command.words[:3] == ("onceflow", "principal", "add")
        ]
        await assert_search_attributes_registered(dev_server.client, namespace)

        async with started_services(services, env, tmp_path) as running:
            await serve_an_agent(
                running, api_key, tenant, database_url, sink, dev_server, namespace
            )


async def serve_an_agent(
    running: list[Service],
    api_key: str,
    tenant: str,
    database_url: str,
    sink: RunningSink,
    dev_server: WorkflowEnvironment,
    namespace: str,
) -> None:
    """An agent's calls through the two gateways, and what the far sides recorded."""
    workers = [service for service in running if service.name == "worker"]
    gateways = [gateway_url(service) for service in running if service.name == "gateway"]
    assert len(workers) == 2 and len(gateways) == 2
    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(timeout=HANG_SECONDS) as http:
        for url in gateways:  # what the load balancer's health checks see
            assert (await http.get(f"{url}/healthz")).status_code == 200
            ready = await http.get(f"{url}/readyz")
            assert ready.status_code == 200, ready.text
            assert ready.json()["checks"] == {"database": "ok", "temporal": "ok"}

        call = {**headers, "Idempotency-Key": "welcome-u42"}
        first = await http.post(
            f"{gateways[0]}/v1/tools/issue_coupon/calls", json=COUPON, headers=call
        )
        assert first.status_code == 200, first.text
        assert "Idempotent-Replayed" not in first.headers
        assert first.json()["state"] == "succeeded"
        assert first.json()["steps"][0]["result"]["already_issued"] is False

        again = await http.post(
            f"{gateways[1]}/v1/tools/issue_coupon/calls", json=COUPON, headers=call
        )
        assert again.status_code == 200, again.text
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.content == first.content

        email = {"to": ["customer@example.com"], "subject": "Welcome, u-42", "body": "Hello!"}
        sent = await http.post(
            f"{gateways[1]}/v1/tools/send_email/calls",
            json=email,
            headers={**headers, "Idempotency-Key": "welcome-mail-u42"},
        )
        assert sent.status_code == 200, sent.text
        assert sent.json()["state"] == "succeeded"

    async with await psycopg.AsyncConnection.connect(database_url) as connection:
        cursor = await connection.execute("SELECT tenant, user_id, coupon_id FROM coupon_issuances")
        assert await cursor.fetchall() == [(tenant, "u-42", "WELCOME10")]
    assert [message.subject for message in sink.sink.received] == ["Welcome, u-42"]
    assert sink.sink.received[0].rcpt_tos == ["customer@example.com"]

    # The task's search attributes were set in the namespace the block prepared; its end
    # is its close status (since 0.6.0), which the listing reads.
    client = await Client.connect(
        dev_server.client.service_client.config.target_host, namespace=namespace
    )
    described = await client.get_workflow_handle(first.json()["task_id"]).describe()
    assert described.typed_search_attributes.get(TASK_STATE) == "running"
    assert described.typed_search_attributes.get(TASK_TENANT) == tenant
    summary = await TaskClient(client, task_queue="unused").summary(first.json()["task_id"])
    assert summary is not None and summary.state == "succeeded"
    # One attempt ran, in one of the two workers (the same key never ran it again).
    attempts = [
        line
        for worker in workers
        for line in worker.log().splitlines()
        if "of issue_coupon step" in line
    ]
    assert len(attempts) == 1 and ": succeeded" in attempts[0], attempts


async def run_once(command: Command, env: dict[str, str], cwd: Path) -> str:
    """Run one line of the block by ``bash`` to its end; returns its standard output."""
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        command.line,
        env=env,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=HANG_SECONDS)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"`{command.line}` did not finish within {HANG_SECONDS:g} s") from None
    assert process.returncode == 0, (
        f"`{command.line}` exited {process.returncode}:\n{stderr.decode(errors='replace')}"
    )
    return stdout.decode().strip()


@asynccontextmanager
async def started_services(
    commands: list[Command], env: dict[str, str], cwd: Path
) -> AsyncIterator[list[Service]]:
    """Start each service line (``exec``'d by ``bash``, so signals reach onceflow) as many
    times as ``STARTED`` says, wait until every one printed that it is ready, and stop them
    all with SIGTERM at the end: each must exit 0 (drained), also when the test failed."""
    running: list[Service] = []
    try:
        for command in commands:
            assert command.service is not None
            for n in range(STARTED.get(command.service, 1)):
                log_path = cwd / f"{command.service}-{n}.log"
                with log_path.open("wb") as log:
                    process = await asyncio.create_subprocess_exec(
                        "bash",
                        "-c",
                        f"exec {command.line}",
                        env=env,
                        cwd=cwd,
                        stdout=log,
                        stderr=asyncio.subprocess.STDOUT,
                    )
                running.append(Service(command.service, process, log_path))
        for service in running:
            assert service.name in READY, f"no known ready line for `onceflow {service.name}`"
        await asyncio.gather(
            *(
                log_line(service.process, service.log_path, READY[service.name])
                for service in running
            )
        )
        yield running
    finally:
        for service in running:
            if service.process.returncode is None:
                service.process.send_signal(signal.SIGTERM)
        exits = await asyncio.gather(*(_exit_code(service) for service in running))
    for service, code in zip(running, exits, strict=True):
        assert code == 0, f"{service.name} exited {code} on SIGTERM:\n{service.log()[-4000:]}"


async def _exit_code(service: Service) -> int:
    try:
        return await asyncio.wait_for(service.process.wait(), timeout=HANG_SECONDS)
    except TimeoutError:
        service.process.kill()
        return await service.process.wait()


def gateway_url(service: Service) -> str:
    """The URL the gateway said it listens on, reached through the loopback interface."""
    [line] = [line for line in service.log().splitlines() if READY["gateway"] in line]
    port = urlsplit(line.split(READY["gateway"], 1)[1].split()[0]).port
    return f"http://127.0.0.1:{port}"


async def assert_search_attributes_registered(client: Client, namespace: str) -> None:
    """Every attribute onceflow upserts is in the namespace, with its type."""
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    registered = {
        name: IndexedValueType.Name(kind) for name, kind in listed.custom_attributes.items()
    }
    assert registered == {
        key.name: f"INDEXED_VALUE_TYPE_{key.indexed_value_type.name}"
        for key in ALL_SEARCH_ATTRIBUTES
    }


@asynccontextmanager
async def fresh_database(postgres_url: str) -> AsyncIterator[str]:
    """A new, empty database on the test PostgreSQL (the "managed" one), dropped after."""
    name = f"prod_{uuid.uuid4().hex[:10]}"
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as admin:
        await admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield urlsplit(postgres_url)._replace(path=f"/{name}").geturl()
    finally:
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as admin:
            await admin.execute(
                sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name))
            )
