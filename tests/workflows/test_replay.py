"""Replays saved histories: a change that breaks determinism for running tasks fails here.

``histories/*.json`` must replay: one per path of the baseline release, and for every
registered patch (``onceflow.workflows.patches``) histories on both of its sides. The
negative control, ``histories/nondeterministic/*.json``, must fail: it proves the check
can fail at all.
"""

import ast
import base64
import importlib
import inspect
import json
import pkgutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

import onceflow.workflows as workflows_package
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.patches import PATCHES
from tests.harness._replay_all import SANDBOX_REFUSED, replay_histories
from tests.telemetry.replay_spans import spans_emitted_by_replay

from .clock_reading_release import ClockReadingRelease
from .scripted_tools import register_scripted_tools

FOLDER = Path(__file__).parent / "histories"
HISTORIES = sorted(FOLDER.glob("*.json"))
NONDETERMINISTIC = sorted((FOLDER / "nondeterministic").glob("*.json"))


async def replay_failure(path: Path) -> Exception | None:
    """What went wrong replaying ``path``, or None when it replayed deterministically."""
    register_scripted_tools()
    replayer = Replayer(workflows=[AgentTaskWorkflow], data_converter=pydantic_data_converter)
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    return result.replay_failure


def patches_in(path: Path) -> set[str]:
    """The patch ids a history's markers record."""
    found = set()
    for event in json.loads(path.read_text())["events"]:
        marker = event.get("markerRecordedEventAttributes")
        if marker and marker["markerName"] == "core_patch":
            [payload] = marker["details"]["patch-data"]["payloads"]
            found.add(json.loads(base64.b64decode(payload["data"]))["id"])
    return found


def patch_ids_in_code() -> set[str]:
    """The ids the workflow passes to ``workflow.patched`` or ``deprecate_patch``, in any
    module of ``onceflow.workflows``."""
    ids = set()
    for info in pkgutil.iter_modules(workflows_package.__path__):
        module = importlib.import_module(f"{workflows_package.__name__}.{info.name}")
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("patched", "deprecate_patch")
            ):
                [argument] = node.args
                value = ast.literal_eval(argument) if isinstance(argument, ast.Constant) else None
                if value is None and isinstance(argument, ast.Name):
                    value = getattr(module, argument.id)
                ids.add(value)
    return ids


def test_every_patch_is_registered_with_histories_on_both_of_its_sides() -> None:
    assert len(HISTORIES) >= 10 and NONDETERMINISTIC
    registered = {patch.id for patch in PATCHES}
    assert patch_ids_in_code() <= registered, "register every patch in onceflow.workflows.patches"
    for patch in PATCHES:
        assert patch.retire_when and patch.since, patch
        with_patch = [path for path in HISTORIES if patch.id in patches_in(path)]
        assert with_patch and len(with_patch) < len(HISTORIES), patch.id


@pytest.mark.parametrize("path", HISTORIES, ids=[path.stem for path in HISTORIES])
async def test_saved_history_replays_deterministically(path: Path) -> None:
    assert await replay_failure(path) is None


@pytest.mark.parametrize("path", NONDETERMINISTIC, ids=[path.stem for path in NONDETERMINISTIC])
async def test_a_nondeterministic_history_fails_replay(path: Path) -> None:
    failure = await replay_failure(path)
    assert isinstance(failure, NondeterminismError), failure


@pytest.mark.parametrize("path", HISTORIES, ids=[path.stem for path in HISTORIES])
async def test_a_replay_emits_no_workflow_spans(path: Path) -> None:
    register_scripted_tools()
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    assert await spans_emitted_by_replay(history) == []


async def test_the_end_of_run_replay_fails_on_a_call_the_strict_sandbox_refuses() -> None:
    # Production passes onceflow through the sandbox (BENCHMARKS.md, "The workflow
    # sandbox"); the replay of every history runs the strict one, and counts a refused
    # call as a divergence.
    register_scripted_tools()
    path = FOLDER / "retries_then_success.json"
    history = WorkflowHistory.from_json(path.stem, path.read_text())

    async def one() -> AsyncIterator[WorkflowHistory]:
        yield history

    clean = await replay_histories(one(), "saved histories")
    assert clean.replayed == 1 and clean.diverged == []
    refused = await replay_histories(
        one(), "saved histories", releases={path.stem: ClockReadingRelease}
    )
    assert len(refused.diverged) == 1 and SANDBOX_REFUSED in refused.diverged[0]
