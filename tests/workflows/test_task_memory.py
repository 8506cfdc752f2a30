"""A task's memory crosses continue-as-new whole: no field is copied by hand.

``AgentTaskWorkflow`` keeps what outlives a run in one ``TaskMemory``; a continued open
task starts from ``for_next_run()`` carried in its input, through Temporal's data
converter. A field added to the model survives with no other edit.
"""

from datetime import UTC, datetime, timedelta

from temporalio.contrib.pydantic import pydantic_data_converter

from onceflow.retry_policy import OutcomeClass
from onceflow.workflows.task_models import (
    AgentTaskInput,
    AttemptRecord,
    DecisionRecord,
    OpenTaskOptions,
    StepState,
    StepStatus,
    TaskMemory,
)

from .scripted_tools import SAFE

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def memory_with_every_field_set() -> TaskMemory:
    call = StepStatus(
        step_id="c1",
        tool="issue_coupon",
        state=StepState.SUCCEEDED,
        arguments={"user_id": "u-1", "coupon_id": "C1"},
        arguments_digest="sha256:" + "a" * 64,
        attempts=[
            AttemptRecord(
                attempt=1,
                outcome=OutcomeClass.SUCCEEDED,
                started_at=NOW,
                finished_at=NOW,
            )
        ],
        evidence={"coupon": "C1"},
    )
    memory = TaskMemory(
        started_at=NOW,
        last_call_at=NOW + timedelta(minutes=5),
        budgeted_attempts=3,
        operator_authorised_attempts=1,
        waited_for_people=timedelta(hours=2),
        calls={"c1": call},
        order=["c1", "c2"],
        repeat_of={"c2": "c1"},
        decisions=[
            DecisionRecord(
                kind="approve",
                step_id="c1",
                decision="approve",
                operator="cfo",
                reason="fine",
                at=NOW,
                via="update",
                arguments_digest=call.arguments_digest,
                accepted=True,
            )
        ],
        policies={SAFE.name: SAFE.policy()},
        runs=4,
    )
    unset = [name for name in TaskMemory.model_fields if name not in memory.model_fields_set]
    assert unset == [], f"set every field in this test: {unset}"
    return memory


def test_every_field_crosses_continue_as_new_through_the_data_converter() -> None:
    memory = memory_with_every_field_set()
    task = AgentTaskInput(tenant="acme", principal="agent", open=OpenTaskOptions())
    continued = task.model_copy(update={"carried": memory.for_next_run()})
    [payload] = pydantic_data_converter.payload_converter.to_payloads([continued])
    [decoded] = pydantic_data_converter.payload_converter.from_payloads([payload], [AgentTaskInput])
    carried = decoded.carried
    assert carried is not None
    for name in TaskMemory.model_fields:
        if name != "calls":
            assert getattr(carried, name) == getattr(memory, name), name
    # Calls cross without their attempts' details, which the earlier run's history keeps.
    [call] = carried.calls.values()
    assert (call.step_id, call.state, call.arguments_digest) == (
        "c1",
        StepState.SUCCEEDED,
        "sha256:" + "a" * 64,
    )
    assert (call.attempts, call.evidence, call.arguments) == ([], {}, {})


def test_a_field_added_to_the_memory_survives_with_no_other_edit() -> None:
    class MemoryWithANote(TaskMemory):
        note: str = ""

    memory = MemoryWithANote(**dict(memory_with_every_field_set()), note="kept")
    assert memory.for_next_run().note == "kept"


def test_calls_cross_as_a_list_as_they_always_did() -> None:
    """Workers of the release before read the carried calls as a list: a rolling
    upgrade hands continued tasks both ways."""
    dumped = memory_with_every_field_set().for_next_run().model_dump(mode="json")
    assert isinstance(dumped["calls"], list)
    assert TaskMemory.model_validate(dumped).calls.keys() == {"c1"}
