"""Production commands never join a dev stack they find on the machine.

A state folder left by ``onceflow dev`` (its recorded provider, SMTP sink and deployment
target URLs, its ``dev.env``) sits beside a worker started without ``STRIPE_API_KEY``:
the worker refuses with one line naming the setting and its fix, and the "local
provider" (a listener here) never sees a connection. Served without the payment tools,
the worker starts, and still nothing reaches the listener.
"""

import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.harness import REPO, onceflow_command, spawn, stop, wait_for_line


class Listener:
    """A TCP port standing in for a dev stack's far side: it counts who connects."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self.connections = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return
            self.connections += 1
            connection.close()

    def close(self) -> None:
        # shutdown wakes the blocked accept(); close alone would leave it waiting.
        self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()
        self._thread.join(timeout=5)


@pytest.fixture
def far_side() -> Iterator[Listener]:
    listener = Listener()
    yield listener
    listener.close()


@pytest.fixture
def dev_state(tmp_path: Path, far_side: Listener) -> Path:
    """A state folder as a running ``onceflow dev`` leaves it, every URL at the listener."""
    state = tmp_path / ".onceflow"
    state.mkdir()
    for name in ("stripe_provider_url", "deploy_target_url", "gateway_url"):
        (state / name).write_text(far_side.url)
    (state / "smtp_url").write_text(far_side.url.replace("http", "smtp"))
    (state / "dev.env").write_text(
        f"export STRIPE_API_KEY=sk_test_local\nexport STRIPE_API_BASE={far_side.url}\n"
    )
    return state


def _without_services(state: Path, database_url: str) -> dict[str, str]:
    return {
        "ONCEFLOW_STATE_DIR": str(state),
        "DATABASE_URL": database_url,
        "STRIPE_API_KEY": "",
        "STRIPE_API_BASE": "",
        "DEPLOY_TARGET_URL": "",
        "SMTP_URL": "",
    }


def test_a_worker_without_stripe_refuses_and_never_reaches_the_dev_provider(
    dev_state: Path, far_side: Listener, postgres_url: str
) -> None:
    ran = _run_beside(dev_state, "worker", database_url=postgres_url)
    assert ran.returncode == 2, ran.stderr
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 2, ran.stderr  # one per missing service, nothing else
    assert (
        "STRIPE_API_KEY is not set, but this worker serves charge_payment and refund_payment"
        in lines[0]
    )
    assert (
        "ONCEFLOW_BUILTIN_TOOLS=issue_coupon,create_order,send_email,start_deployment" in lines[0]
    )
    assert "DEPLOY_TARGET_URL is not set" in lines[1]
    assert "Traceback" not in ran.stderr
    assert far_side.connections == 0


async def test_a_worker_serving_only_what_is_configured_starts_and_leaves_the_dev_stack_alone(
    dev_state: Path, far_side: Listener, postgres_url: str, dev_server: WorkflowEnvironment
) -> None:
    worker = spawn(
        onceflow_command(
            "worker", "--temporal-address", dev_server.client.service_client.config.target_host
        ),
        env={
            **_without_services(dev_state, postgres_url),
            "ONCEFLOW_BUILTIN_TOOLS": "issue_coupon,create_order,send_email",
            "ONCEFLOW_TASK_QUEUE": "production-commands",
        },
        cwd=dev_state.parent,
    )
    try:
        wait_for_line(worker, "onceflow worker ready")
    finally:
        output = stop(worker)
    # The worker has exited: nothing more can connect, so the count is final.
    assert worker.returncode == 0, output
    assert far_side.connections == 0


def test_a_relay_without_smtp_refuses_with_the_fix(dev_state: Path, postgres_url: str) -> None:
    ran = _run_beside(dev_state, "relay", database_url=postgres_url)
    assert ran.returncode == 2, ran.stderr
    assert "SMTP_URL is not set; fix:" in ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1, ran.stderr


def _run_beside(
    state: Path, command: str, *, database_url: str
) -> subprocess.CompletedProcess[str]:
    """Run ``onceflow command`` in the folder holding the dev stack's state, without services."""
    return subprocess.run(
        onceflow_command(command),
        cwd=state.parent,
        env={**os.environ, "PYTHONPATH": str(REPO), **_without_services(state, database_url)},
        capture_output=True,
        text=True,
        timeout=60,
    )
