"""What a cached task holds in a worker: no validator of its own for the models it decodes.

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

from ..conftest import repo_root

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
