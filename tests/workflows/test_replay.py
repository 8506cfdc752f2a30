"""Replays saved histories: a change that breaks determinism for running tasks fails here."""

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from onceflow.workflows import AgentTaskWorkflow
from tests.telemetry.replay_spans import spans_emitted_by_replay

from .scripted_tools import register_scripted_tools

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_there_are_histories_to_replay() -> None:
    assert len(HISTORIES) >= 3


@pytest.mark.parametrize("path", HISTORIES, ids=[path.stem for path in HISTORIES])
async def test_saved_history_replays_deterministically(path: Path) -> None:
    register_scripted_tools()
    replayer = Replayer(workflows=[AgentTaskWorkflow], data_converter=pydantic_data_converter)
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None


@pytest.mark.parametrize("path", HISTORIES, ids=[path.stem for path in HISTORIES])
async def test_a_replay_emits_no_workflow_spans(path: Path) -> None:
    register_scripted_tools()
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    assert await spans_emitted_by_replay(history) == []
