"""Runs an agent framework's caller (``caller_process.py``) in the client-only virtualenv
the Makefile makes, as its user would: nothing of the server's on its path."""

import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from tests.conftest import repo_root
from tests.harness import spawn, stop, wait_for_line

from .caller_process import READY, REPLAYED

CALLER_VENV = repo_root() / ".venv-temporal-agents"
CALLER_PYTHON = CALLER_VENV / "bin" / "python"


@contextmanager
def caller_running(
    module: str,
    task_queue: str,
    temporal_address: str,
    started: Callable[[], int],
    *,
    env: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[str]]:
    """The caller ``module``'s worker on ``task_queue`` until the block ends; then every
    history it ran is replayed with its own plugins, and none may diverge. ``started``
    counts the workflows the block started (each must have been replayed); ``env`` adds
    to the caller's environment."""
    if not CALLER_PYTHON.exists():
        pytest.fail(
            f"{CALLER_PYTHON} is missing: `make test` creates it (the agent frameworks'"
            " Temporal integrations, with the client only: the OpenAI one needs an"
            " openai-agents of its own)"
        )
    process = spawn(
        # -P and this folder alone on the path: the caller imports its framework, the
        # client and caller_process, never the repository's server or tests packages.
        [str(CALLER_PYTHON), "-P", "-m", module, task_queue],
        env={
            "TEMPORAL_ADDRESS": temporal_address,
            "PYTHONPATH": str(repo_root() / "tests" / "nexus"),
            **(env or {}),
        },
    )
    try:
        wait_for_line(process, READY)
    except BaseException:
        print(stop(process))
        raise
    try:
        yield process
    except BaseException:
        print(stop(process))
        raise
    output = stop(process)
    assert process.returncode == 0 and f"{REPLAYED} {started()}" in output.splitlines(), output
