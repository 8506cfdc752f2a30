"""``onceflow dev`` as a user runs it: starts, serves, survives a crash, stops cleanly.

Every wait is for its event (a line printed, a process exited), bounded only against a
hang: ``onceflow dev`` returns from a restart once the orphaned server has exited, and
from a stop once its servers have, so "not alive" is checked after the fact, not raced.
"""

import json
import os
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.harness import HANG_SECONDS, REPO, onceflow_command, spawn, stop, wait_for_line

# Starting the whole stack twice is slow on a loaded two-core machine.
pytestmark = pytest.mark.timeout(400)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def postmaster_pid(state_dir: Path) -> int | None:
    pid_file = state_dir / "postgres" / "postmaster.pid"
    return int(pid_file.read_text().splitlines()[0]) if pid_file.exists() else None


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/status").read_text().count("State:\tZ")


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """The stack's state folder; whatever a failed test left running there is stopped."""
    state = tmp_path / "state"
    yield state
    stop_what_is_left(state)


def stop_what_is_left(state: Path) -> None:
    """Stop the stack, Temporal server and PostgreSQL a failed test left in ``state``."""
    for pid_file, marker in (
        (state / "temporal.pid", b"start-dev"),
        (state / "dev.lock", b"\x00cli\x00dev"),
    ):
        if pid_file.exists() and pid_file.read_text().strip().isdigit():
            pid = int(pid_file.read_text())
            command = Path(f"/proc/{pid}/cmdline")
            if command.exists() and marker in command.read_bytes():
                _signal(pid, signal.SIGKILL)
    if (pid := postmaster_pid(state)) is not None:
        _signal(pid, signal.SIGINT)  # PostgreSQL's fast shutdown


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def test_the_dev_stack_runs_recovers_from_a_crash_and_stops_cleanly(
    tmp_path: Path, state_dir: Path
) -> None:
    temporal_port, ui_port = free_port(), free_port()
    env = {
        "ONCEFLOW_STATE_DIR": str(state_dir),
        "DATABASE_URL": "",
        "TEMPORAL_ADDRESS": f"127.0.0.1:{temporal_port}",
    }
    dev = ["dev", "--temporal-port", str(temporal_port), "--ui-port", str(ui_port)]

    first = spawn(onceflow_command(*dev), env=env)
    banner = wait_for_line(first, "Press Ctrl-C", timeout=240)  # a hang: the whole stack
    assert any(f"127.0.0.1:{temporal_port}" in line for line in banner)
    assert any(f"http://localhost:{ui_port}" in line for line in banner)
    assert any("onceflow-tools (as principal dev/dev-agent)" in line for line in banner)
    with urllib.request.urlopen(f"http://localhost:{ui_port}/", timeout=HANG_SECONDS) as page:
        assert page.status == 200

    second = subprocess.run(
        onceflow_command(*dev),
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )
    assert second.returncode == 1
    assert "already running" in second.stderr and "Traceback" not in second.stderr

    call = subprocess.run(
        onceflow_command(
            "call",
            "issue_coupon",
            "--tenant",
            "acme",
            "--key",
            "dev-1",
            "--wait",
            "--args",
            '{"user_id": "u-dev", "coupon_id": "HELLO"}',
        ),
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )
    assert call.returncode == 0, call.stderr
    task = json.loads(call.stdout)
    assert task["state"] == "succeeded"

    # Another shell joins the stack only by sourcing what it wrote: a production worker
    # started that way has every service it needs (it refuses to start otherwise).
    join = state_dir / "dev.env"
    assert any(f"source {join}" in line for line in banner)
    joined = spawn(
        ["bash", "-c", f'source "{join}" && exec "$@"', "bash", *onceflow_command("worker")],
        env={"ONCEFLOW_STATE_DIR": str(state_dir)},
    )
    wait_for_line(joined, "onceflow worker ready")
    assert "onceflow worker stopped" in stop(joined)

    # A crash: the stack dies without cleaning up its servers or its files.
    temporal_pid = int((tmp_path / "state" / "temporal.pid").read_text())
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert alive(temporal_pid)

    again = spawn(onceflow_command(*dev), env=env)
    restarted = wait_for_line(again, "Press Ctrl-C", timeout=240)
    assert not alive(temporal_pid)  # the orphaned server was stopped, not reused blindly
    # The server kept its endpoint: found as it was, not created twice.
    assert any("onceflow-tools (as principal dev/dev-agent)" in line for line in restarted)
    status = subprocess.run(
        onceflow_command("status", task["workflow_id"], "--json"),
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "succeeded"  # history survived the crash
    database_url = (tmp_path / "state" / "database_url").read_text()
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM coupon_issuances").fetchone() == (1,)
    postgres = postmaster_pid(tmp_path / "state")

    again.send_signal(signal.SIGINT)
    output = stop(again)
    assert again.returncode == 0, output
    assert "stopped cleanly" in output
    assert not alive(postgres)
    assert not (tmp_path / "state" / "temporal.pid").exists()
