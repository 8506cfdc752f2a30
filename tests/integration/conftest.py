"""Worker processes on the real Temporal dev server and embedded PostgreSQL."""

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.harness import onceflow_command, spawn, stop, wait_for_line

WorkerFactory = Callable[[], subprocess.Popen[str]]


@pytest.fixture
def worker_processes(
    dev_server: WorkflowEnvironment, database: str, task_queue: str, tmp_path: Path
) -> Iterator[WorkerFactory]:
    """Starts ``onceflow worker`` processes on this test's task queue; stops them after."""
    started: list[subprocess.Popen[str]] = []
    environment = {
        "TEMPORAL_ADDRESS": dev_server.client.service_client.config.target_host,
        "DATABASE_URL": database,
        "ONCEFLOW_TASK_QUEUE": task_queue,
        "ONCEFLOW_SHUTDOWN_GRACE_SECONDS": "5",
        # The local tools only: no Stripe key or deployment target here, and a worker
        # serves no tool whose service it lacks.
        "ONCEFLOW_BUILTIN_TOOLS": "issue_coupon,create_order,send_email",
        "ONCEFLOW_STATE_DIR": str(tmp_path / "state"),
    }

    def start() -> subprocess.Popen[str]:
        process = spawn(onceflow_command("worker"), env=environment)
        started.append(process)
        wait_for_line(process, "onceflow worker ready")
        return process

    yield start
    for process in started:
        stop(process)
