"""Replays saved histories: a change that breaks determinism for running tasks fails here.

``histories/*.json`` are the current release's: one per path, and for every patch the
code branches on (``onceflow.workflows.patches``) histories on both of its sides.
``histories/releases/V/*.json`` were recorded by release V's own code (CHANGELOG.md) and
must replay as long as V is supported: its tasks may still be open, parked or awaiting a
person after the upgrade. A marker such a history holds must stay accepted by the code
(``patched`` or ``deprecate_patch``): removing it would strand V's open tasks.

The negative controls must fail: ``histories/nondeterministic/*.json`` proves the check can
fail at all, and 0.1.0's histories replayed without the rules of 0.1.0 prove those rules
are what keeps its tasks running.
"""

import ast
import base64
import importlib
import inspect
import json
import pkgutil
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

import onceflow.workflows as workflows_package
from onceflow.plugin import OnceflowPlugin
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.patches import CURRENT_RELEASE, PATCHES, START_PATCHES_FOLDED
from onceflow.workflows.task_models import AgentTaskInput, TaskStatus
from tests.harness._replay_all import SANDBOX_REFUSED, replay_histories
from tests.telemetry.replay_spans import spans_emitted_by_replay

from .clock_reading_release import ClockReadingRelease
from .scripted_tools import register_scripted_tools

FOLDER = Path(__file__).parent / "histories"
CURRENT = sorted(FOLDER.glob("*.json"))
RELEASES = FOLDER / "releases"
EARLIER = sorted(RELEASES.glob("*/*.json"))
HISTORIES = CURRENT + EARLIER
NONDETERMINISTIC = sorted((FOLDER / "nondeterministic").glob("*.json"))
CHANGELOG = Path(__file__).parents[2] / "CHANGELOG.md"


def history_id(path: Path) -> str:
    return path.stem if path.parent == FOLDER else f"{path.parent.name}/{path.stem}"


@workflow.defn(name="AgentTaskWorkflow", sandboxed=False)
class WithoutTheRulesOf010(AgentTaskWorkflow):
    """The current code taking 0.1.0's first marker but not its rules: what a release
    that only deprecated 0.1.0's patch ids would run."""

    @workflow.init
    def __init__(self, task: AgentTaskInput) -> None:
        super().__init__(task)
        run = self._book.run

        def take_release_of_start() -> None:
            workflow.deprecate_patch(START_PATCHES_FOLDED)
            run.started_on_0_1_0 = False

        # Where the task's books learn which release started the run, they learn 0.1.0's
        # marker and none of its rules.
        self._book.take_release_of_start = take_release_of_start  # type: ignore[method-assign]

    @workflow.run
    async def run(self, task: AgentTaskInput) -> TaskStatus:
        return await super().run(task)


async def replay_failure(path: Path, release: type = AgentTaskWorkflow) -> Exception | None:
    """What went wrong replaying ``path``, or None when it replayed deterministically."""
    register_scripted_tools()
    replayer = Replayer(
        workflows=[], plugins=[OnceflowPlugin(workflows=[release], strict_sandbox=True)]
    )
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
    assert len(CURRENT) >= 10 and NONDETERMINISTIC
    registered = {patch.id for patch in PATCHES}
    assert patch_ids_in_code() <= registered, "register every patch in onceflow.workflows.patches"
    for patch in PATCHES:
        assert patch.retire_when and patch.since, patch
        if patch.stage == "patched":
            with_patch = [path for path in CURRENT if patch.id in patches_in(path)]
            assert with_patch and len(with_patch) < len(CURRENT), patch.id
        else:
            assert patch.since in supported_releases(), patch


def test_every_marker_a_supported_release_recorded_is_still_accepted() -> None:
    # A patch id leaves the code only once no task that recorded it can be open: its
    # release's saved histories go first (docs/production.md, "Ship a workflow change").
    accepted = patch_ids_in_code()
    for path in HISTORIES:
        assert patches_in(path) <= accepted, (history_id(path), patches_in(path) - accepted)


def supported_releases() -> set[str]:
    """The releases whose tasks this code still runs: the current one and every earlier
    one with saved histories, each in CHANGELOG.md."""
    earlier = {folder.name for folder in RELEASES.iterdir() if folder.is_dir()}
    return earlier | {CURRENT_RELEASE}


def test_each_supported_release_is_in_the_changelog_with_its_commit() -> None:
    entry = r"^## (\d+\.\d+\.\d+) .*?commit `([0-9a-f]{7,40})`"
    entries = dict(re.findall(entry, CHANGELOG.read_text(), re.M))
    earlier = supported_releases() - {CURRENT_RELEASE}
    assert earlier and earlier <= set(entries), (earlier, entries)
    for release in earlier:
        assert len(list((RELEASES / release).glob("*.json"))) >= 10, release


@pytest.mark.parametrize("path", HISTORIES, ids=[history_id(path) for path in HISTORIES])
async def test_saved_history_replays_deterministically(path: Path) -> None:
    assert await replay_failure(path) is None


def test_a_saved_history_holds_two_reconciles_accepted_in_one_workflow_task() -> None:
    """The workflow's rule for handlers (they issue no command; a reconcile's look-up runs
    in the parked step's own coroutine) is what lets two decisions accepted in one workflow
    task replay: one saved history holds exactly that, both look-ups scheduled in the same
    workflow task after both acceptances, and replays above."""
    # Whether the two decisions share a workflow task depends on the recording's timing:
    # any saved copy (this release's or a supported earlier one's) that holds it will do.
    batches: list[list[str]] = []
    for path in sorted(FOLDER.glob("**/open_task_two_parked_calls_reconciled.json")):
        for event in json.loads(path.read_text())["events"]:
            kind = event["eventType"].removeprefix("EVENT_TYPE_")
            if kind == "WORKFLOW_TASK_COMPLETED":
                batches.append([])
            elif batches and not kind.startswith("WORKFLOW_TASK_"):
                accepted = event.get("workflowExecutionUpdateAcceptedEventAttributes")
                scheduled = event.get("activityTaskScheduledEventAttributes")
                if accepted is not None:
                    batches[-1].append(f"accepted {accepted['acceptedRequest']['input']['name']}")
                elif scheduled is not None:
                    batches[-1].append(f"scheduled {scheduled['activityType']['name']}")
        batches.append([])  # a copy's last batch ends with it
    both = ["accepted reconcile"] * 2 + ["scheduled look_up_scripted_provider"] * 2
    assert any(batch[:4] == both for batch in batches), batches


WITHOUT_THE_RULES_OF_010 = [
    RELEASES / "0.1.0" / f"{name}.json"
    for name in (
        "open_task_calls_repeat_park_close",
        "open_task_continued_as_new",
        "pinned_provider_key_retry_within_window",
        "pinned_send_by_refused_then_lookup_and_park",
        "key_generation_after_stored_failure",
        "database_outage_waited_out",
    )
]


@pytest.mark.parametrize(
    "path", WITHOUT_THE_RULES_OF_010, ids=[path.stem for path in WITHOUT_THE_RULES_OF_010]
)
async def test_a_0_1_0_task_does_not_replay_without_the_rules_of_0_1_0(path: Path) -> None:
    failure = await replay_failure(path, WithoutTheRulesOf010)
    assert isinstance(failure, NondeterminismError), failure


@pytest.mark.parametrize("path", NONDETERMINISTIC, ids=[path.stem for path in NONDETERMINISTIC])
async def test_a_nondeterministic_history_fails_replay(path: Path) -> None:
    failure = await replay_failure(path)
    assert isinstance(failure, NondeterminismError), failure


@pytest.mark.parametrize("path", HISTORIES, ids=[history_id(path) for path in HISTORIES])
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
