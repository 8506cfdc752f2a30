"""Two ``onceflow dev`` stacks at once on one host, each on its own port base and state folder.

Each runs tasks end to end, joined only through its own ``dev.env``: the same idempotency
key in both is two tasks with two effects, one per stack's database and SMTP sink, so
nothing is shared. A third stack is refused on a folder in use and on ports in use.
"""

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from onceflow_devstack.ports import StackPorts, port_is_taken

from tests.devstack.test_dev_stack import stop_what_is_left
from tests.harness import REPO, eventually_blocking, onceflow_command, spawn, stop, wait_for_line

# Two stacks starting at once on a loaded two-core machine.
pytestmark = pytest.mark.timeout(400)

STACK_PORTS = len(StackPorts.from_base(1).chosen())


def free_port_base(avoid: range | None = None) -> int:
    """A base whose ports are all free now; below Linux's ephemeral range (32768 up), where
    the Temporal servers' own random ports and client sockets land."""
    while True:
        base = random.randrange(20000, 32000)
        wanted = range(base, base + STACK_PORTS)
        if avoid is not None and set(wanted) & set(avoid):
            continue
        if not any(port_is_taken(port) for port in wanted):
            return base


@pytest.fixture
def two_states(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Two state folders; whatever a failed test left running in them is stopped."""
    states = tmp_path / "first", tmp_path / "second"
    yield states
    for state in states:
        stop_what_is_left(state)


def joined(state: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in a shell that joined the stack by sourcing its ``dev.env``."""
    return subprocess.run(
        ["bash", "-c", f'source {shlex.quote(str(state / "dev.env"))} && exec "$@"', "bash"]
        + list(command),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def exported(state: Path) -> dict[str, str]:
    """What sourcing the stack's ``dev.env`` sets."""
    shown = joined(
        state, sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"
    )
    assert shown.returncode == 0, shown.stderr
    environment: dict[str, str] = json.loads(shown.stdout)
    return environment


def http(url: str, body: dict[str, Any] | None = None, **headers: str) -> Any:
    request = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


def test_two_dev_stacks_run_side_by_side_each_on_its_own_ports_and_state(
    tmp_path: Path, two_states: tuple[Path, Path]
) -> None:
    first_base = free_port_base()
    bases = first_base, free_port_base(avoid=range(first_base, first_base + STACK_PORTS))
    unused_default = tmp_path / "default-state"
    env = {
        # --state-dir wins over the setting; the stacks run their own far sides.
        "ONCEFLOW_STATE_DIR": str(unused_default),
        "DATABASE_URL": "",
        **dict.fromkeys(("STRIPE_API_KEY", "STRIPE_API_BASE", "SMTP_URL", "DEPLOY_TARGET_URL"), ""),
    }
    stacks = [
        spawn(onceflow_command("dev", "--port-base", str(base), "--state-dir", str(state)), env=env)
        for base, state in zip(bases, two_states, strict=True)
    ]
    banners = [wait_for_line(stack, "Press Ctrl-C", timeout=300) for stack in stacks]

    for base, state, banner in zip(bases, two_states, banners, strict=True):
        ports = StackPorts.from_base(base)
        assert any(f"127.0.0.1:{ports.temporal}" in line for line in banner), banner
        assert any(f"source {state / 'dev.env'}" in line for line in banner), banner
        settings = exported(state)
        assert settings["TEMPORAL_ADDRESS"] == f"127.0.0.1:{ports.temporal}"
        assert settings["ONCEFLOW_GATEWAY_URL"] == f"http://127.0.0.1:{ports.gateway}"
        assert settings["STRIPE_API_BASE"] == f"http://127.0.0.1:{ports.provider}"
        assert settings["SMTP_URL"] == f"smtp://127.0.0.1:{ports.smtp}"
        assert settings["DEPLOY_TARGET_URL"] == f"http://127.0.0.1:{ports.deploy_target}"
        assert settings["ONCEFLOW_STATE_DIR"] == str(state)
        notes = (state / "dev.env").read_text()
        assert f"http://localhost:{ports.ui}" in notes
        assert f"http://127.0.0.1:{ports.smtp_control}/messages" in notes

        # The same key in both stacks: were anything shared, the second would join the first.
        call = joined(
            state,
            *onceflow_command("call", "issue_coupon", "--tenant", "acme", "--key", "twin-1"),
            *("--wait", "--args", '{"user_id": "u-twin", "coupon_id": "TWIN"}'),
        )
        assert call.returncode == 0, call.stderr
        assert json.loads(call.stdout)["state"] == "succeeded"
        http(
            f"{settings['ONCEFLOW_GATEWAY_URL']}/v1/tools/send_email/calls",
            {"to": ["twin@example.com"], "subject": f"from {base}", "body": "hello"},
            Authorization=f"Bearer {(state / 'dev_api_key').read_text().strip()}",
            **{"Idempotency-Key": "twin-mail"},
        )

    for base, state in zip(bases, two_states, strict=True):
        sink = f"http://127.0.0.1:{StackPorts.from_base(base).smtp_control}/messages"
        received = eventually_blocking(
            lambda: http(sink)["received"],  # noqa: B023 - called before the loop moves on
            what=f"the sink of the stack on {base} received its email",
            timeout=60,
        )
        assert [message["subject"] for message in received] == [f"from {base}"]
        with psycopg.connect((state / "database_url").read_text()) as conn:
            assert conn.execute("SELECT count(*) FROM coupon_issuances").fetchone() == (1,)

    # A third stack: refused on a folder in use, and on ports in use (before it starts
    # anything), each with one line.
    on_used_folder = subprocess.run(
        onceflow_command(
            "dev", "--port-base", str(free_port_base()), "--state-dir", str(two_states[0])
        ),
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert on_used_folder.returncode == 1
    assert "already running" in on_used_folder.stderr, on_used_folder.stderr
    on_used_ports = subprocess.run(
        onceflow_command(
            "dev", "--port-base", str(bases[1]), "--state-dir", str(tmp_path / "third")
        ),
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert on_used_ports.returncode == 1
    assert f"{bases[1] + 2} (--gateway-port)" in on_used_ports.stderr, on_used_ports.stderr
    for refused in (on_used_folder, on_used_ports):
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert not (tmp_path / "third" / "postgres").exists()

    for stack in stacks:
        stack.send_signal(signal.SIGINT)  # as Ctrl-C
    for stack in stacks:
        output = stop(stack)
        assert stack.returncode == 0, output
        assert "stopped cleanly" in output
    assert not unused_default.exists()
