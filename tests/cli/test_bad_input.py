"""Bad input to the CLI: one line on stderr, a non-zero exit, never a traceback."""

import subprocess

import pytest

from tests.harness import REPO, onceflow_command


def run(*arguments: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        onceflow_command(*arguments),
        cwd=REPO,
        env={**os.environ, "TEMPORAL_ADDRESS": "127.0.0.1:1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("arguments", "exit_code", "message"),
    [
        (
            ["call", "issue_coupon", "--tenant", "acme", "--key", "k1", "--args", "{bad"],
            2,
            "not valid JSON",
        ),
        (
            ["call", "issue_coupon", "--tenant", "acme", "--key", "k1", "--args", "[1]"],
            2,
            "JSON object",
        ),
        (
            ["call", "no_such_tool", "--tenant", "acme", "--key", "k1"],
            2,
            "unknown tool 'no_such_tool'",
        ),
        (
            ["call", "issue_coupon", "--tenant", "acme", "--key", "bad key!"],
            2,
            "idempotency key may hold only",
        ),
        (["call", "issue_coupon", "--tenant", "acme", "--key", "k" * 201], 2, "longer than 200"),
        (
            [
                "call",
                "issue_coupon",
                "--tenant",
                "acme",
                "--key",
                "k1",
                "--args",
                '{"user_id": "u"}',
            ],
            2,
            "coupon_id: Field required",
        ),
        (
            [
                "call",
                "issue_coupon",
                "--tenant",
                "ac me",
                "--key",
                "k1",
                "--args",
                '{"user_id": "u", "coupon_id": "c"}',
            ],
            2,
            "tenant: String should match pattern",
        ),
        (
            ["reconcile", "t-1", "--step", "s", "--decision", "happened", "--reason", "found it"],
            2,
            "needs the resource id",
        ),
        (["status", "t-1"], 69, "cannot reach Temporal"),
        (["tasks", "--state", "parked"], 69, "cannot reach Temporal"),
    ],
)
def test_bad_input_gets_one_line_and_a_nonzero_exit(
    arguments: list[str], exit_code: int, message: str
) -> None:
    result = run(*arguments)
    assert result.returncode == exit_code, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_an_unknown_decision_is_a_usage_error() -> None:
    result = run("reconcile", "t-1", "--step", "s", "--decision", "maybe", "--reason", "r")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "maybe" in result.stderr


def test_a_worker_without_a_database_says_how_to_get_one(tmp_path: object) -> None:
    result = run("worker", env={"DATABASE_URL": "", "ONCEFLOW_STATE_DIR": str(tmp_path)})
    assert result.returncode == 2
    assert "DATABASE_URL is not set; fix: set it to your PostgreSQL" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_a_bad_setting_names_the_variable() -> None:
    result = run("worker", env={"ONCEFLOW_DB_POOL_MAX_SIZE": "zero"})
    assert result.returncode == 2
    assert "ONCEFLOW_DB_POOL_MAX_SIZE" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_bad_tool_setting_read_at_start_up_names_the_variable() -> None:
    # Tool settings are read when a command builds the tools (never at import, so a
    # command that needs no tool, like `status`, is not stopped by them).
    call = ("call", "issue_coupon", "--tenant", "t", "--key", "k-1")
    result = run(*call, env={"ONCEFLOW_PAYMENTS_KEY_RETENTION": "forever"})
    assert result.returncode == 2
    assert "ONCEFLOW_PAYMENTS_KEY_RETENTION" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
