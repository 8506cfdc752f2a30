"""Replays saved histories: a change that breaks determinism for running tasks fails here.

``histories/*.json`` must replay: the three recorded before policies were pinned (the
old side of every patch) and the ``pinned_*`` ones (the new side). The negative control,
``histories/nondeterministic/*.json``, must fail: it proves the check can fail at all.
"""

import base64
import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.agent_task import (
    DATABASE_WAITS,
    DECISIONS_CHECKED,
    KEY_GENERATIONS,
    MACHINE_TIME_DEADLINE,
    OLD_KEY_SETTLES,
    PINNED_POLICY,
    SEND_BY_ENFORCED,
    START_PATCHES_FOLDED,
    UNVERIFIED_RECORDED,
)
from tests.telemetry.replay_spans import spans_emitted_by_replay

from .scripted_tools import register_scripted_tools

FOLDER = Path(__file__).parent / "histories"
HISTORIES = sorted(FOLDER.glob("*.json"))
NONDETERMINISTIC = sorted((FOLDER / "nondeterministic").glob("*.json"))
PATCHES = (
    PINNED_POLICY,
    SEND_BY_ENFORCED,
    MACHINE_TIME_DEADLINE,
    DECISIONS_CHECKED,
    KEY_GENERATIONS,
    UNVERIFIED_RECORDED,
    DATABASE_WAITS,
    OLD_KEY_SETTLES,
    START_PATCHES_FOLDED,
)


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


def test_there_are_histories_to_replay_on_both_sides_of_every_patch() -> None:
    assert len(HISTORIES) >= 10 and NONDETERMINISTIC
    for patch in PATCHES:
        with_patch = [path for path in HISTORIES if patch in patches_in(path)]
        assert with_patch and len(with_patch) < len(HISTORIES), patch


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
