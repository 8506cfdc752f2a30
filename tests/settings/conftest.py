"""Settings tests run against a known environment: none of onceflow's variables set."""

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from onceflow.settings import CONFIG_FILE_VARIABLE

ONCEFLOW_VARIABLES = ("ONCEFLOW_", "DATABASE_URL", "STRIPE_", "SMTP_URL", "DEPLOY_TARGET_URL")


def without_onceflow_variables(environment: dict[str, str]) -> dict[str, str]:
    """``environment`` without any variable a onceflow settings class reads."""
    return {
        name: value
        for name, value in environment.items()
        if not name.upper().startswith(ONCEFLOW_VARIABLES) and name.upper() != "API_KEY"
    }


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in set(os.environ) - set(without_onceflow_variables(dict(os.environ))):
        monkeypatch.delenv(name)


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Path]:
    """Write ``onceflow.toml`` with the given text and point ONCEFLOW_CONFIG at it."""

    def write(text: str) -> Path:
        path = tmp_path / "onceflow.toml"
        path.write_text(text)
        monkeypatch.setenv(CONFIG_FILE_VARIABLE, str(path))
        return path

    return write
