"""``onceflow --config``, ``config check|show`` and the start-up check, as processes."""

import os
import subprocess
from pathlib import Path

from tests.harness import REPO, onceflow_command
from tests.settings.conftest import without_onceflow_variables

SECRET = "sk_live_do-not-print-me-42"


def onceflow(
    *arguments: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        onceflow_command(*arguments),
        cwd=REPO,
        env={
            **without_onceflow_variables(dict(os.environ)),
            "TEMPORAL_ADDRESS": "127.0.0.1:1",
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_bad_file_stops_the_worker_at_start_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[onceflow]\ndb_pool_max_size = 500\n")

    result = onceflow("--config", str(bad), "worker", env={"ONCEFLOW_STATE_DIR": str(tmp_path)})

    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"error: invalid setting ONCEFLOW_DB_POOL_MAX_SIZE ([onceflow] db_pool_max_size in "
        f"{bad}): Input should be less than or equal to 200; fix: set a value the message "
        "allows, or remove it to use the default 10"
    ]
    assert "Traceback" not in result.stdout + result.stderr


def test_every_problem_is_reported_even_when_a_tool_reads_its_settings_at_import(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[tools.payments]\nkey_retention = "PT1H"\nretention_margin = "PT2H"\n\n'
        "[stripe]\naccount = 'not an account'\n\n[gatewy]\nx = 1\n"
    )

    result = onceflow(f"--config={bad}", "gateway", env={"ONCEFLOW_EMAIL_BATCH_SIZE": "0"})

    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert all(line.startswith("error: ") for line in lines), lines
    for part in (
        "invalid settings [tools.payments] (ONCEFLOW_PAYMENTS_*)",
        "ONCEFLOW_STRIPE_ACCOUNT ([stripe] account in",
        "ONCEFLOW_EMAIL_BATCH_SIZE (file key [email] batch_size)",
        "unknown table [gatewy]",
    ):
        assert sum(part in line for line in lines) == 1, (part, lines)
    assert len(lines) == 4
    assert "Traceback" not in result.stdout + result.stderr


def test_config_check_says_which_file_it_read(tmp_path: Path) -> None:
    good = tmp_path / "onceflow.toml"
    good.write_text("[onceflow]\ntask_queue = 'from-the-file'\n")

    with_file = onceflow("--config", str(good), "config", "check")
    without_file = onceflow("config", "check")

    assert with_file.returncode == 0, with_file.stderr
    assert with_file.stdout.startswith("configuration OK")
    assert str(good) in with_file.stdout
    assert without_file.returncode == 0, without_file.stderr
    assert "configuration OK" in without_file.stdout
    assert "ONCEFLOW_CONFIG is not set" in without_file.stdout


def test_config_check_reports_problems_like_the_commands(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"

    result = onceflow("--config", str(missing), "config", "check")

    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: config file {missing} does not exist; fix: point ONCEFLOW_CONFIG (or --config) "
        "at a TOML file, or unset it"
    ]


def test_config_show_prints_the_effective_settings_with_secrets_masked(tmp_path: Path) -> None:
    good = tmp_path / "onceflow.toml"
    good.write_text(
        f"""
        [onceflow]
        task_queue = "from-the-file"
        db_pool_max_size = 20
        database_url = "postgresql://onceflow:{SECRET}@db.internal:5432/onceflow"

        [stripe]
        api_key = "{SECRET}"
        """
    )

    result = onceflow(
        "--config", str(good), "config", "show", env={"ONCEFLOW_DB_POOL_MAX_SIZE": "7"}
    )

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"# file: {good}"
    for line in (
        "[onceflow]",
        'task_queue = "from-the-file"',
        "db_pool_max_size = 7",
        'database_url = "postgresql://onceflow:***@db.internal:5432/onceflow"',
        "tools = []",
        "[stripe]",
        'api_key = "***"',
        "# api_base is not set",
        "[tools.payments]",
        'key_retention = "P1D"',
        "[gateway]",
        "db_pool_max_size = 20",
    ):
        assert line in lines, (line, result.stdout)
    assert SECRET not in result.stdout + result.stderr
