"""A long-running command that cannot start says why in one line, with the fix, and leaves
with the exit code of that kind of failure (``ExitCode``), never with a traceback.

Each runs as a real process against a real PostgreSQL, with what it depends on made
unreachable or wrong on purpose: a closed port for Temporal or PostgreSQL, an unknown API
key, a port another program holds.
"""

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from onceflow.cli._failures import ExitCode
from tests.harness import REPO, onceflow_command


@pytest.fixture(scope="module")
def closed_port() -> int:
    """A port nothing listens on (bound once, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another program listens on."""
    with socket.create_server(("127.0.0.1", 0)) as holder:
        yield holder.getsockname()[1]


def start(*arguments: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        onceflow_command(*arguments),
        cwd=REPO,
        env={**os.environ, "ONCEFLOW_BUILTIN_TOOLS": "issue_coupon,create_order", **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_one_line(ran: subprocess.CompletedProcess[str], exit_code: int, *said: str) -> None:
    """One ``error:`` line, the last one on stderr (start-up logs may come before it)."""
    assert "Traceback" not in ran.stderr + ran.stdout, ran.stderr
    lines = ran.stderr.strip().splitlines()
    [failure] = [line for line in lines if line.startswith("error:")]
    assert lines[-1] == failure, ran.stderr
    assert ran.returncode == exit_code, ran.stderr
    for words in said:
        assert words in failure, ran.stderr


@pytest.mark.parametrize("command", ["gateway", "worker"])
def test_temporal_unreachable_is_one_line_and_exit_69(
    command: str, postgres_url: str, closed_port: int
) -> None:
    ran = start(
        command,
        *(["--port", "0"] if command == "gateway" else []),
        env={"DATABASE_URL": postgres_url, "TEMPORAL_ADDRESS": f"127.0.0.1:{closed_port}"},
    )
    assert_one_line(
        ran,
        ExitCode.UNAVAILABLE,
        f"cannot reach Temporal at 127.0.0.1:{closed_port}: Connection refused",
        "fix: start it",
    )


@pytest.mark.parametrize("command", ["worker", "gateway", "relay", "mcp"])
def test_postgres_unreachable_is_one_line_and_exit_69(
    command: str, closed_port: int, tmp_path: Path
) -> None:
    ran = start(
        command,
        env={
            "DATABASE_URL": f"postgresql://onceflow:secret@127.0.0.1:{closed_port}/onceflow",
            "TEMPORAL_ADDRESS": f"127.0.0.1:{closed_port}",
            "SMTP_URL": f"smtp://127.0.0.1:{closed_port}",
            "ONCEFLOW_API_KEY": "ofk_" + "x" * 43,
        },
    )
    assert_one_line(
        ran,
        ExitCode.UNAVAILABLE,
        f'cannot reach PostgreSQL (DATABASE_URL): connection to server at "127.0.0.1", port '
        f"{closed_port} failed: Connection refused",
        "fix: start it, or point DATABASE_URL at your PostgreSQL",
    )
    assert "secret" not in ran.stderr


def test_dev_with_postgres_unreachable_ends_on_one_line_and_exit_69(
    closed_port: int, tmp_path: Path
) -> None:
    ran = start(
        "dev",
        "--state-dir",
        str(tmp_path / "state"),
        env={"DATABASE_URL": f"postgresql://onceflow@127.0.0.1:{closed_port}/onceflow"},
    )
    # Its progress lines come first.
    assert_one_line(ran, ExitCode.UNAVAILABLE, "cannot reach PostgreSQL (DATABASE_URL)")


def test_mcp_with_an_unknown_api_key_is_one_line_and_exit_77(
    postgres_url: str, closed_port: int
) -> None:
    # Temporal is unreachable too: the key is checked first, against the database alone.
    ran = start(
        "mcp",
        env={
            "DATABASE_URL": postgres_url,
            "TEMPORAL_ADDRESS": f"127.0.0.1:{closed_port}",
            "ONCEFLOW_API_KEY": "ofk_" + "x" * 43,
        },
    )
    assert_one_line(
        ran,
        ExitCode.CREDENTIALS_REFUSED,
        "the API key is not valid; fix: set ONCEFLOW_API_KEY",
    )


def test_a_database_role_postgres_refuses_is_exit_77(postgres_url: str) -> None:
    refused = postgres_url.replace("postgresql://postgres:", "postgresql://nobody-here:")
    assert refused != postgres_url
    ran = start("relay", env={"DATABASE_URL": refused, "SMTP_URL": "smtp://127.0.0.1:1"})
    assert_one_line(
        ran,
        ExitCode.CREDENTIALS_REFUSED,
        "PostgreSQL refused the credentials in DATABASE_URL",
        'role "nobody-here" does not exist',
    )


def test_a_gateway_port_in_use_is_one_line_and_exit_1(
    postgres_url: str, held_port: int, temporal_address: str
) -> None:
    ran = start(
        "gateway",
        "--port",
        str(held_port),
        env={"DATABASE_URL": postgres_url, "TEMPORAL_ADDRESS": temporal_address},
    )
    assert_one_line(
        ran,
        ExitCode.FAILED,
        f"port {held_port} on 127.0.0.1 is already in use; fix:",
    )


@pytest.fixture
def temporal_address(dev_server: object) -> str:
    """The address of the session's Temporal dev server."""
    client = dev_server.client  # type: ignore[attr-defined]
    address: str = client.service_client.config.target_host
    return address
