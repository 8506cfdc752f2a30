"""Every task history a test run made, replayed at its end: a divergence fails the run.

The saved histories (``tests/workflows/histories``) pin the paths someone thought of;
this pins every path the suite actually took, parallel calls and races included. Each
history is replayed from its first event in the workflow sandbox, with nothing cached,
as a worker that took the task over would.
"""

import sys
import tempfile
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from temporalio.client import (
    Client,
    Interceptor,
    OutboundInterceptor,
    StartWorkflowInput,
    WorkflowHandle,
    WorkflowHistory,
)
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from onceflow.plugin import OnceflowPlugin
from onceflow.settings import ProcessSettings
from onceflow.tools.worker import CATALOGUE, ENTRY_POINT_GROUP, load_tools, register_tools
from onceflow.workflows import AgentTaskWorkflow


@dataclass
class ReplayReport:
    """What replaying one server's task histories found."""

    server: str
    replayed: int = 0
    diverged: list[str] = field(default_factory=list)
    """``workflow id: error`` of every history whose replay decided otherwise."""
    not_replayable: list[str] = field(default_factory=list)
    """Histories this process could not replay for another reason (a tool the test
    process does not register): not a divergence, but named."""


class StartedWorkflows(Interceptor):
    """Remembers the id of every workflow its client starts: the time-skipping server
    cannot list them."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        ids = self.ids

        class Recording(OutboundInterceptor):
            async def start_workflow(self, input: StartWorkflowInput) -> WorkflowHandle[Any, Any]:
                if input.workflow == "AgentTaskWorkflow":
                    ids.append(input.id)
                return await super().start_workflow(input)

        return Recording(next)


async def replay_every_task(
    client: Client, server: str, *, workflow_ids: Iterable[str] | None = None
) -> ReplayReport:
    """Replay every ``AgentTaskWorkflow`` history ``client``'s namespace holds (or those
    of ``workflow_ids``, where the server cannot list them)."""
    histories: AsyncIterator[WorkflowHistory]
    if workflow_ids is None:
        query = "WorkflowType = 'AgentTaskWorkflow'"
        histories = client.list_workflows(query).map_histories()
    else:
        histories = _fetched(client, workflow_ids)
    return await replay_histories(histories, server)


async def replay_histories(
    histories: AsyncIterator[WorkflowHistory],
    server: str,
    *,
    releases: Mapping[str, type] | None = None,
) -> ReplayReport:
    """Replay ``histories`` with ``OnceflowPlugin`` in the strict sandbox, caching
    nothing: each with this release's ``AgentTaskWorkflow``, or the class ``releases``
    (``OTHER_RELEASES`` by default) names for its workflow id."""
    releases = OTHER_RELEASES if releases is None else releases
    report = ReplayReport(server)
    register_replay_tools()
    replayer = Replayer(
        workflows=[], plugins=[OnceflowPlugin(workflows=[AgentTaskWorkflow], strict_sandbox=True)]
    )
    other_releases: list[WorkflowHistory] = []

    async def this_release() -> AsyncIterator[WorkflowHistory]:
        async for history in histories:
            if history.workflow_id in releases:
                other_releases.append(history)
            else:
                yield history

    async with replayer.workflow_replay_iterator(this_release()) as replays:
        async for result in replays:
            _count(report, result.history, result.replay_failure)
    for history in other_releases:
        release = Replayer(
            workflows=[],
            plugins=[
                OnceflowPlugin(workflows=[releases[history.workflow_id]], strict_sandbox=True)
            ],
        )
        result = await release.replay_workflow(history, raise_on_replay_failure=False)
        _count(report, history, result.replay_failure)
    return report


async def _fetched(client: Client, workflow_ids: Iterable[str]) -> AsyncIterator[WorkflowHistory]:
    for workflow_id in dict.fromkeys(workflow_ids):
        yield await client.get_workflow_handle(workflow_id).fetch_history()


def _keep(history: WorkflowHistory) -> Path:
    """Where a diverged history is kept for whoever investigates it (the servers that
    held it are gone once the run ends)."""
    folder = Path(tempfile.gettempdir()) / "onceflow-diverged-histories"
    folder.mkdir(exist_ok=True)
    path = folder / f"{history.workflow_id.replace('/', '_').replace(':', '_')}.json"
    path.write_text(history.to_json())
    return path


SANDBOX_REFUSED = "RestrictedWorkflowAccessError"
"""In a replay failure: the workflow's code made a call the strict sandbox refuses (a
clock, randomness, I/O), which would not replay the same."""
OTHER_RELEASES: dict[str, type] = {}
"""Workflow id -> the workflow class of the simulated release that ran the task (an
upgrade test's release N+1): its history is replayed with that class."""


def _count(report: ReplayReport, history: WorkflowHistory, failure: Exception | None) -> None:
    report.replayed += 1
    if failure is None:
        return
    line = f"{history.workflow_id}: {type(failure).__name__}: {failure}"
    # The replay runs the workflow in the strict sandbox, which production's runner does
    # not (it passes onceflow through): a call the sandbox refuses is a divergence too.
    if isinstance(failure, NondeterminismError) or SANDBOX_REFUSED in str(failure):
        report.diverged.append(f"{line} (history: {_keep(history)})")
    else:
        report.not_replayable.append(line)


INSTALLED_ELSEWHERE: list[tuple[Path, str]] = []
"""``(folder, ONCEFLOW_TOOLS spec)`` of custom tools a test installed outside this
environment for its own workers (the examples): the replay loads them from there."""


def replay_tools_from(folder: Path, spec: str) -> None:
    """Let the end-of-run replay load ``spec``'s tools from ``folder``, where a test
    installed them for its workers."""
    INSTALLED_ELSEWHERE.append((folder, spec))


def register_replay_tools() -> None:
    """Register the tools the run's workers served: the built-in ones and the custom
    tools they loaded with ``ONCEFLOW_TOOLS`` (from this environment, or where a test
    installed them), so every task replays here as on its workers."""
    from tests.tool_configuration import builtin  # imports the whole tool set: only here

    register_tools(tool for tool in builtin() if tool.name not in CATALOGUE)
    specs = [point.name for point in entry_points(group=ENTRY_POINT_GROUP)]
    for folder, spec in INSTALLED_ELSEWHERE:
        if str(folder) not in sys.path:
            sys.path.append(str(folder))
        specs.append(spec)
    for spec in dict.fromkeys(specs):
        register_tools(
            tool for tool in load_tools([spec], ProcessSettings()) if tool.name not in CATALOGUE
        )
