"""Who writes a task's outcome is one field of its input, ``outcome_writer``, while every
input in history, and every input a worker of the previous release may be handed, holds the
two flags it replaced (``record_outcome``, ``starter_records_outcome``)."""

import ast
import tarfile

import pytest
from pydantic_core import to_json

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


def test_an_input_holds_only_fields_the_previous_release_reads() -> None:
    """Its ``AgentTaskInput`` forbids unknown fields, and its workers still run while
    gateways of this release start tasks: every field written must be one it knows, in
    its order."""
    with tarfile.open(archive_path(previous_release())) as archive:
        member = archive.extractfile("onceflow/workflows/task_models.py")
        assert member is not None
        source = member.read().decode()
    model = next(
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef) and node.name == "AgentTaskInput"
    )
    known = [
        statement.target.id
        for statement in model.body
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
    ]
    task = AgentTaskInput(
        tenant="acme",
        principal="agent",
        steps=[StepInput(**STEP)],
        outcome_writer=OutcomeWriter.STARTER,
    )
    written = list(task.model_dump(mode="json"))
    assert written == [name for name in known if name in written]
