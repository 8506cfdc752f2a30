"""What the workflow sandbox costs: CPU to replay the saved task histories per runner.

A replay is what a worker does for a task it does not hold in its cache (a decision on a
parked task, a status query after an eviction) and, one workflow task at a time, what it
does live. Three runners replay the same histories (``tests/workflows/histories``), the
arms taking turns in rounds, CPU time of this process measured per arm:

- baseline: production's sandbox (``onceflow.plugin.PASS_THROUGH_SANDBOX``, wrapped as a
  worker wraps it in ``DeliveredEventsRunner``): onceflow's modules passed through, so a
  task does not import the workflow module again;
- strict: Temporal's default sandbox, which imports ``agent_task.py`` again for every
  workflow and proxies what its own code touches (what the tests' workers and the
  end-of-run replay use: a non-deterministic call there fails);
- no sandbox: ``UnsandboxedWorkflowRunner``, for scale.

Usage: ``.venv/bin/python -m bench.sandbox_tradeoff [--rounds 5]``
"""

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from bench._report import RESULTS, run_info
from onceflow.plugin import PASS_THROUGH_SANDBOX, DeliveredEventsRunner
from onceflow.workflows import AgentTaskWorkflow
from tests.workflows.scripted_tools import register_scripted_tools

HISTORIES = Path(__file__).resolve().parent.parent / "tests" / "workflows" / "histories"
PRODUCTION = DeliveredEventsRunner(PASS_THROUGH_SANDBOX)
RUNNERS: dict[str, WorkflowRunner] = {
    "production (onceflow passed through)": PRODUCTION,
    "strict sandbox (agent_task.py imported per task)": SandboxedWorkflowRunner(),
    "no sandbox": UnsandboxedWorkflowRunner(),
}
BASELINE = "production (onceflow passed through)"


async def _replay_all(runner: WorkflowRunner, histories: list[WorkflowHistory]) -> float:
    """CPU seconds this process spent replaying every history once with ``runner``."""
    replayer = Replayer(
        workflows=[AgentTaskWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=runner,
    )
    started = time.process_time()
    for history in histories:
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        if result.replay_failure is not None:
            raise RuntimeError(f"{history.workflow_id}: {result.replay_failure}")
    return time.process_time() - started


async def main(rounds: int) -> dict[str, Any]:
    register_scripted_tools()
    histories = [
        WorkflowHistory.from_json(path.stem, path.read_text())
        for path in sorted(HISTORIES.glob("*.json"))
    ]
    events = sum(len(history.events) for history in histories)
    await _replay_all(PRODUCTION, histories)  # warm-up: imports, caches
    per_replay: dict[str, list[float]] = {name: [] for name in RUNNERS}
    for _ in range(rounds):
        for name, runner in RUNNERS.items():
            seconds = await _replay_all(runner, histories)
            per_replay[name].append(seconds * 1000 / len(histories))
    baseline = statistics.median(per_replay[BASELINE])
    arms = {
        name: {
            "ms_per_replay": statistics.median(values),
            "ratio": statistics.median(values) / baseline,
            "rounds_ms": [round(value, 3) for value in values],
        }
        for name, values in per_replay.items()
    }
    results = {
        "title": "CPU per task replay, by workflow runner",
        "run": run_info(
            n_per_arm=rounds * len(histories),
            concurrency=1,
            rounds=rounds,
            arguments={"rounds": rounds},
        ),
        "histories": len(histories),
        "events": events,
        "baseline": BASELINE,
        "strict": arms["strict sandbox (agent_task.py imported per task)"],
        "production": arms[BASELINE],
        "unsandboxed": arms["no sandbox"],
    }
    (RESULTS / "sandbox_tradeoff.json").write_text(json.dumps(results, indent=2) + "\n")
    for name, arm in arms.items():
        print(f"{name:52} {arm['ms_per_replay']:8.2f} ms per replay  {arm['ratio']:.2f}×")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(parser.parse_args().rounds))
