"""What a cached task holds in a worker beyond its own state: no validator of its own for
the models it decodes, and no second copy of what an earlier run carried to it.

Temporal gives every workflow run a payload converter of its own, and the pydantic
converter makes a ``TypeAdapter`` for each type it decodes. For a complete model the
adapter reuses the model's validator and serializer; for one left incomplete at import
(it names a model defined after it) the adapter builds both again, and the run keeps
them as long as it is cached: about 40 KiB of every waiting task, and the CPU of a
schema build for every task a worker starts or replays (BENCHMARKS.md, "worker memory").
"""

import json
import subprocess
import sys
import tracemalloc
from datetime import UTC, datetime

from temporalio.contrib.pydantic import pydantic_data_converter

from onceflow.workflows._task_book import memory_of_run
from onceflow.workflows._task_run import TaskRun
from onceflow.workflows.task_models import (
    AgentTaskInput,
    OpenTaskOptions,
    StepState,
    StepStatus,
    TaskMemory,
)

from ..conftest import repo_root

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)

PROBE = r"""
import json

from pydantic import BaseModel, TypeAdapter

import onceflow.worker  # what a worker process imports: workflows, tools, activities
from onceflow.workflows.task_models import AgentTaskInput

models, seen = [], set()
pending = [BaseModel]
while pending:
    for subclass in pending.pop().__subclasses__():
        if subclass not in seen:
            seen.add(subclass)
            pending.append(subclass)
            if subclass.__module__.startswith("onceflow"):
                models.append(subclass)
# A task's input as a run's own converter first meets it, before anything in the
# process made or validated one: through a new TypeAdapter.
adapter = TypeAdapter(AgentTaskInput)
print(json.dumps({
    "models": len(models),
    "incomplete": [
        f"{model.__module__}.{model.__qualname__}"
        for model in models
        if not model.__pydantic_complete__
    ],
    "task_input_validator_shared": adapter.validator is AgentTaskInput.__pydantic_validator__,
}))
"""


def test_a_worker_process_decodes_every_task_with_the_models_own_validator() -> None:
    """In a fresh interpreter, as a worker starts: every onceflow model is complete once
    imported, so no run's converter builds a validator of its own."""
    probe = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=repo_root(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = json.loads(probe.stdout)
    assert found["models"] > 20, found
    assert found["incomplete"] == [], "rebuild each at the end of its module"
    assert found["task_input_validator_shared"]


def test_a_continued_run_holds_its_carried_calls_once() -> None:
    """The run's input stays in memory with the run: its memory is the carried one
    itself, not a second copy of every call the task made before."""
    calls = {
        f"c{n}": StepStatus(
            step_id=f"c{n}",
            tool="issue_coupon",
            state=StepState.SUCCEEDED,
            arguments={},
            arguments_digest="sha256:" + "a" * 64,
            result={"coupon": f"C{n}"},
        )
        for n in range(200)
    }
    memory = TaskMemory(started_at=NOW, last_call_at=NOW, calls=calls, order=list(calls))
    continued = AgentTaskInput(
        tenant="acme", principal="agent", open=OpenTaskOptions(), carried=memory.for_next_run()
    )
    [payload] = pydantic_data_converter.payload_converter.to_payloads([continued])
    [task] = pydantic_data_converter.payload_converter.from_payloads([payload], [AgentTaskInput])
    tracemalloc.start()
    try:
        memory = memory_of_run(task)
        run = TaskRun(waiting_since=memory.started_at)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert memory is task.carried and run.waiting_since == NOW
    assert memory.calls.keys() == calls.keys()
    assert memory.runs == 2
    # A copy of 200 carried calls is about 300 KiB; the run's own state is a few.
    assert held < 32 * 1024, f"the run holds {held // 1024} KiB beside its input"
