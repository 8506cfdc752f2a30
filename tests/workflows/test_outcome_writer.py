"""Who writes a task's outcome is one field of its input, ``outcome_writer``, while every
input in history, and every input a worker of the previous release may be handed, holds the
two flags it replaced (``record_outcome``, ``starter_records_outcome``)."""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from pydantic_core import to_json

from onceflow.tools.worker import CATALOGUE
from onceflow.workflows.task_models import AgentTaskInput, OutcomeWriter, StepInput

from ..upgrade.release_archive import archive_path, previous_release

STEP = {"step_id": "1", "tool": "issue_coupon", "arguments": {}}


@pytest.mark.parametrize(
    ("record_outcome", "starter_records_outcome", "writer"),
    [
        (False, False, OutcomeWriter.NONE),
        (False, True, OutcomeWriter.NONE),
        (True, False, OutcomeWriter.WORKFLOW),
        (True, True, OutcomeWriter.STARTER),
    ],
)
def test_an_input_with_the_old_flags_names_the_writer_they_meant(
    record_outcome: bool, starter_records_outcome: bool, writer: OutcomeWriter
) -> None:
    task = AgentTaskInput.model_validate_json(
        to_json(
            {
                "tenant": "acme",
                "principal": "agent",
                "steps": [STEP],
                "record_outcome": record_outcome,
                "starter_records_outcome": starter_records_outcome,
            }
        )
    )
    assert task.outcome_writer is writer


@pytest.mark.parametrize("writer", list(OutcomeWriter))
def test_an_input_is_written_with_the_flags_and_read_back_as_its_writer(
    writer: OutcomeWriter,
) -> None:
    task = AgentTaskInput(
        tenant="acme", principal="agent", steps=[StepInput(**STEP)], outcome_writer=writer
    )
    written = task.model_dump(mode="json")
    assert "outcome_writer" not in written
    assert written["record_outcome"] is (writer is not OutcomeWriter.NONE)
    assert written["starter_records_outcome"] is (writer is OutcomeWriter.STARTER)
    assert AgentTaskInput.model_validate_json(to_json(task)) == task


@pytest.mark.parametrize("writer", list(OutcomeWriter))
def test_the_previous_release_reads_an_input_as_this_one_wrote_it(
    writer: OutcomeWriter, tmp_path: Path
) -> None:
    """Its ``AgentTaskInput`` forbids unknown fields, and its workers still run while
    gateways of this release start tasks: its own model (from its archive, in a process of
    its own) must take every input this release writes, with the same outcome writer."""
    with tarfile.open(archive_path(previous_release())) as archive:
        archive.extractall(tmp_path, filter="data")
    task = AgentTaskInput(
        tenant="acme",
        principal="agent",
        steps=[StepInput(**STEP)],
        policies=CATALOGUE.policies(["issue_coupon"]) if "issue_coupon" in CATALOGUE else None,
        outcome_writer=writer,
    )
    read_back = subprocess.run(
        [sys.executable, "-c", _READ_AS_THE_PREVIOUS_RELEASE],
        input=to_json(task),
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        cwd=tmp_path,  # ``-c`` puts the working directory first on the path
        check=False,
    )
    assert read_back.returncode == 0, read_back.stderr.decode()
    origin, written_by = read_back.stdout.decode().split()
    assert origin == str(tmp_path / "onceflow" / "__init__.py")
    assert written_by == writer.value


_READ_AS_THE_PREVIOUS_RELEASE = """
import sys
import onceflow
from onceflow.workflows.task_models import AgentTaskInput
task = AgentTaskInput.model_validate_json(sys.stdin.buffer.read())
print(onceflow.__file__, task.outcome_writer.value)
"""
