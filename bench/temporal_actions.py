"""What a task costs in Temporal Cloud actions, the figure a Temporal Cloud user pays for,
against a bare Temporal workflow doing the same business effect.

Each scenario runs once through onceflow's boundary (``BoundaryService``, in process, as
the HTTP gateway and the MCP server run it) and worker, and once as a bare workflow on
a worker of its own; then every run's history is fetched and its events are classified
by Temporal Cloud's definition of a billable action
(https://docs.temporal.io/cloud/actions):

- **workflow started**: a start (a deduplicated start is not one), each continue-as-new
  run; **activity attempts**: each attempt that started (``ActivityTaskStarted.attempt``);
- **local activities**: all the markers of one workflow task count as one action, so one
  per workflow task that recorded a local activity's marker; **patch markers alone**: a
  workflow task whose only markers are patches (``workflow.patched``), by the same rule
  (the docs state it for every ``RecordMarker`` of a workflow task);
- **timers** started; **search-attribute upserts** (one per command, whatever it sets;
  the attributes given at start and ``TemporalChangeVersion`` alone are exempt);
- **signals** received (and sent by a workflow); **updates** accepted (a rejected one is
  billed too but leaves no event: the client's interceptor counts what it was refused);
- **queries** received by a worker: no event either, so counted by an interceptor on the
  boundary's Temporal client (the bench's own waiting uses ``describe``, never a query);
- child workflows (two each), workflow options updated, Nexus operations scheduled.

Not billed and not counted: workflow tasks, memo changes, describes, history reads, list
and count (visibility).

Scenarios, onceflow vs bare:

- **one-step task**: ``POST /v1/tools/issue_coupon/calls``; bare: a workflow running one
  activity;
- **open task, one call**: create an open task, one call (an Update), close it; bare: a
  workflow answering a ``call`` Update with one activity, then a ``close`` Update;
  **each further call**: the same with ``--calls`` calls, less the one-call task, per call;
- **parked, then reconciled**: a tool whose outcome is unknown (``bench/_parking_tool.py``)
  parks; an operator reconciles it (``happened``); bare: an activity whose outcome is
  unknown, then a ``reconcile`` Update;
- **approval**: a tool that needs approval (``bench/_approval_tool.py``) waits; a person
  approves; bare: an ``approve`` Update, then the activity.

Usage: ``.venv/bin/python -m bench.temporal_actions [--calls 3]`` (about a minute).
"""

import argparse
import asyncio
import json
import tempfile
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import (
    Client,
    Interceptor,
    OutboundInterceptor,
    QueryWorkflowInput,
    SignalWorkflowInput,
    StartWorkflowUpdateInput,
    StartWorkflowUpdateWithStartInput,
    WorkflowHandle,
    WorkflowUpdateHandle,
)
from temporalio.worker import Worker

from bench._approval_tool import APPROVAL_TOOL
from bench._bare import (
    BareApprovalWorkflow,
    BareReconciledWorkflow,
    BareUpdateWorkflow,
    BareWorkflow,
    no_op,
    unknown_outcome,
)
from bench._parking_tool import PARKING_TOOL
from bench._report import RESULTS, machine, run_info
from bench._servers import embedded_servers
from onceflow.coupons import coupon_tools
from onceflow.gateway import (
    TOOL_CALL_STEP_ID,
    BoundaryService,
    GatewaySettings,
    Principal,
    PrincipalStore,
)
from onceflow.idempotency import IdempotencyStore
from onceflow.settings import OnceflowSettings
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient
from onceflow.tools.worker import Catalogue, arguments_digest
from onceflow.worker import build_worker
from onceflow.workflows.visibility import TASK_STATE
from tests.harness import eventually

TITLE = "Temporal actions per task"
RESULTS_STEM = "temporal_actions_per_task"

KINDS = (
    "workflow started",
    "activity attempts",
    "local activities (one per workflow task)",
    "patch markers alone (one per workflow task)",
    "timers",
    "search-attribute upserts",
    "signals",
    "updates accepted",
    "updates rejected",
    "queries",
    "child workflows (two each)",
    "workflow options updated",
    "Nexus operations",
)
"""The billable action kinds, in the table's order."""

SCENARIOS = (
    "one-step task",
    "open task, one call",
    "each further call",
    "parked, then reconciled",
    "approval",
)

_LOCAL_ACTIVITY_MARKER = "core_local_activity"
_EXEMPT_ATTRIBUTE = "TemporalChangeVersion"


# ── classifying a history ───────────────────────────────────────────────────────────


@dataclass
class Classified:
    """One workflow's billable actions by kind, and what the events were (for reading)."""

    actions: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)
    """Every event type of the history, billed or not."""
    details: list[str] = field(default_factory=list)
    """One line per billable event: what it was (a timer's summary, the attributes an
    upsert set, the signal or update's name)."""


def classify(events: list[HistoryEvent]) -> Classified:
    """The billable actions of one or more runs' events (Temporal Cloud's definition)."""
    found = Classified()
    marker_tasks: dict[int, set[str]] = {}
    for event in events:
        kind = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_").lower()
        found.events[kind] += 1
        match event.event_type:
            case EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                found.actions["workflow started"] += 1
                found.details.append("workflow started")
            case EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                attempts = max(event.activity_task_started_event_attributes.attempt, 1)
                found.actions["activity attempts"] += attempts
            case EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                activity = event.activity_task_scheduled_event_attributes.activity_type.name
                found.details.append(f"activity {activity}")
            case EventType.EVENT_TYPE_MARKER_RECORDED:
                marker = event.marker_recorded_event_attributes
                marker_tasks.setdefault(marker.workflow_task_completed_event_id, set()).add(
                    marker.marker_name
                )
            case EventType.EVENT_TYPE_TIMER_STARTED:
                found.actions["timers"] += 1
                found.details.append(f"timer {_summary(event)}".rstrip())
            case EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
                names = sorted(
                    event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
                )
                if names != [_EXEMPT_ATTRIBUTE]:
                    found.actions["search-attribute upserts"] += 1
                    found.details.append(f"upsert {', '.join(names)}")
            case (
                EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
                | EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED
            ):
                found.actions["signals"] += 1
                received = event.workflow_execution_signaled_event_attributes
                sent = event.signal_external_workflow_execution_initiated_event_attributes
                name = received.signal_name or sent.signal_name
                found.details.append(f"signal {name}")
            case EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
                found.actions["updates accepted"] += 1
                update = event.workflow_execution_update_accepted_event_attributes
                found.details.append(f"update {update.accepted_request.input.name}")
            case EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
                found.actions["child workflows (two each)"] += 2
            case EventType.EVENT_TYPE_WORKFLOW_EXECUTION_OPTIONS_UPDATED:
                found.actions["workflow options updated"] += 1
            case EventType.EVENT_TYPE_NEXUS_OPERATION_SCHEDULED:
                found.actions["Nexus operations"] += 1
    for markers in marker_tasks.values():
        if _LOCAL_ACTIVITY_MARKER in markers:
            found.actions["local activities (one per workflow task)"] += 1
            found.details.append("local activities of one workflow task")
        else:
            found.actions["patch markers alone (one per workflow task)"] += 1
            found.details.append(f"markers {', '.join(sorted(markers))} of one workflow task")
    return found


def _summary(event: HistoryEvent) -> str:
    """A timer's summary as the workflow wrote it (a JSON string payload), if any."""
    summary = event.user_metadata.summary
    if not summary.data:
        return ""
    try:
        return str(json.loads(summary.data))
    except ValueError:
        return "(summary not readable)"


async def history(client: Client, workflow_id: str) -> list[HistoryEvent]:
    """Every event of every run of ``workflow_id``, the first run first (a continued-as-new
    run names the run it continues)."""
    runs: list[list[HistoryEvent]] = []
    run_id: str | None = None
    while True:
        handle: WorkflowHandle[Any, Any] = client.get_workflow_handle(workflow_id, run_id=run_id)
        events = [event async for event in handle.fetch_history_events()]
        runs.insert(0, events)
        started = events[0].workflow_execution_started_event_attributes
        if not started.continued_execution_run_id:
            return [event for run in runs for event in run]
        run_id = started.continued_execution_run_id


# ── what the boundary asks of Temporal outside histories ────────────────────────────


class MessageCounter(Interceptor):
    """Counts the queries (and refused updates) a client sends: billed, never in history."""

    def __init__(self) -> None:
        self.counted: Counter[str] = Counter()

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _Counting(next, self.counted)


class _Counting(OutboundInterceptor):
    def __init__(self, next: OutboundInterceptor, counted: Counter[str]) -> None:
        super().__init__(next)
        self._counted = counted

    async def query_workflow(self, input: QueryWorkflowInput) -> Any:
        self._counted["queries"] += 1
        return await super().query_workflow(input)

    async def signal_workflow(self, input: SignalWorkflowInput) -> None:
        self._counted["signals sent"] += 1
        await super().signal_workflow(input)

    async def start_workflow_update(
        self, input: StartWorkflowUpdateInput
    ) -> WorkflowUpdateHandle[Any]:
        self._counted["updates sent"] += 1
        try:
            return await super().start_workflow_update(input)
        except Exception:
            self._counted["updates rejected"] += 1
            raise

    async def start_update_with_start_workflow(
        self, input: StartWorkflowUpdateWithStartInput
    ) -> WorkflowUpdateHandle[Any]:
        self._counted["updates sent"] += 1
        return await super().start_update_with_start_workflow(input)


# ── the two stacks ──────────────────────────────────────────────────────────────────


@dataclass
class Onceflow:
    """onceflow's boundary and worker on the servers, and what its client sent."""

    service: BoundaryService
    principal: Principal
    client: Client
    """The bench's own client (history reads and waits: not counted)."""
    counter: MessageCounter
    """What the boundary's client sent."""


@asynccontextmanager
async def onceflow_stack(database_url: str, client: Client) -> AsyncIterator[Onceflow]:
    queue = f"actions-{uuid.uuid4().hex[:8]}"
    tools = (*coupon_tools(), PARKING_TOOL, APPROVAL_TOOL)
    counter = MessageCounter()
    counted = counted_client(client, counter)
    async with (
        build_pool(database_url, max_size=8) as worker_pool,
        build_pool(database_url, max_size=8, autocommit=True) as pool,
        build_worker(client, worker_pool, OnceflowSettings(task_queue=queue), tools=tools),
    ):
        principal, _ = await PrincipalStore(pool).create(
            tenant="bench",
            name="actions",
            tools=[tool.name for tool in tools],
            may_decide=True,
        )
        service = BoundaryService(
            principals=PrincipalStore(pool),
            records=IdempotencyStore(pool),
            tasks=TaskClient(counted, task_queue=queue),
            # A parked or waiting task answers 202 after this wait (what it costs in
            # actions does not depend on it).
            settings=GatewaySettings(replay_wait_seconds=2),
            catalogue=Catalogue(tuple(tool.contract for tool in tools)),
        )
        yield Onceflow(service=service, principal=principal, client=client, counter=counter)


async def state_is(client: Client, workflow_id: str, state: str) -> None:
    """Wait until the task shows ``state`` (its search attribute: a describe, no query)."""

    async def current() -> str | None:
        described = await client.get_workflow_handle(workflow_id).describe()
        return described.typed_search_attributes.get(TASK_STATE)

    await eventually(current, until=lambda seen: seen == state, what=f"{workflow_id} is {state}")


# ── scenarios ───────────────────────────────────────────────────────────────────────


async def measured(
    client: Client, counter: MessageCounter, run: Callable[[], Awaitable[list[str]]]
) -> tuple[Classified, Counter[str]]:
    """Run a scenario (it returns the workflow ids it made) and classify their histories,
    read through ``client``; with the queries (and refused updates) ``counter`` saw
    meanwhile."""
    counter.counted.clear()
    workflow_ids = await run()
    sent = Counter(counter.counted)
    classified = Classified()
    for workflow_id in workflow_ids:
        await client.get_workflow_handle(workflow_id).result()
        one = classify(await history(client, workflow_id))
        classified.actions += one.actions
        classified.events += one.events
        classified.details += one.details
    classified.actions["queries"] += sent["queries"]
    classified.actions["updates rejected"] += sent["updates rejected"]
    return classified, sent


Stack = TypeVar("Stack", "Onceflow", "Bare")


async def measured_arm(
    client: Client,
    counter: MessageCounter,
    stack: Stack,
    scenarios: dict[str, Callable[[Stack], Awaitable[list[str]]]],
) -> dict[str, tuple[Classified, Counter[str]]]:
    """Each of one arm's scenarios, run in turn on its ``stack`` and ``measured``."""
    return {
        name: await measured(client, counter, partial(scenario, stack))
        for name, scenario in scenarios.items()
    }


async def onceflow_one_step(stack: Onceflow) -> list[str]:
    answer = await stack.service.call_tool(
        stack.principal,
        "issue_coupon",
        {"user_id": f"u-{uuid.uuid4().hex[:8]}", "coupon_id": "ACTIONS"},
        f"one-step-{uuid.uuid4().hex[:8]}",
    )
    assert answer.status_code == 200, answer.body
    return [answer.task_id]


def onceflow_open_task(calls: int) -> Callable[[Onceflow], Awaitable[list[str]]]:
    async def scenario(stack: Onceflow) -> list[str]:
        created = await stack.service.open_task(
            stack.principal, {"open": {}}, f"open-{uuid.uuid4().hex[:8]}"
        )
        assert created.status_code == 201, created.body
        for number in range(calls):
            answer = await stack.service.call_in_task(
                stack.principal,
                created.task_id,
                {
                    "tool": "issue_coupon",
                    "arguments": {"user_id": f"u-{uuid.uuid4().hex[:8]}", "coupon_id": "OPEN"},
                },
                f"call-{number}-{uuid.uuid4().hex[:8]}",
            )
            assert answer.status_code == 200, answer.body
        await stack.service.close_task(stack.principal, created.task_id)
        return [created.task_id]

    return scenario


async def waiting_call(stack: Onceflow, tool: str, call: str, state: str) -> tuple[str, str]:
    """A call of ``tool`` for a reference of its own (its call id ``call-<reference>``),
    answered 202, its task waiting in ``state``; the reference and the task id."""
    reference = f"r-{uuid.uuid4().hex[:8]}"
    answer = await stack.service.call_tool(
        stack.principal, tool, {"reference": reference}, f"{call}-{reference}"
    )
    assert answer.status_code == 202, answer.body
    await state_is(stack.client, answer.task_id, state)
    return reference, answer.task_id


async def onceflow_parked(stack: Onceflow) -> list[str]:
    reference, task_id = await waiting_call(stack, PARKING_TOOL.name, "parked", "parked")
    await stack.service.reconcile(
        stack.principal,
        task_id,
        {
            "step_id": TOOL_CALL_STEP_ID,
            "decision": "happened",
            "reason": "bench: the transfer was found at the far side",
            "resource_id": reference,
            "unverified": True,
        },
    )
    return [task_id]


async def onceflow_approval(stack: Onceflow) -> list[str]:
    reference, task_id = await waiting_call(
        stack, APPROVAL_TOOL.name, "approval", "awaiting_approval"
    )
    # The digest the approval is bound to, computed here rather than read from the task
    # (``GET /v1/tasks/{id}``, a query) as an approver's screen would: the bare approval
    # reads nothing either.
    digest = arguments_digest(APPROVAL_TOOL.name, {"reference": reference})
    await stack.service.approve(
        stack.principal,
        task_id,
        {
            "step_id": TOOL_CALL_STEP_ID,
            "approved": True,
            "reason": "bench: approved",
            "arguments_digest": digest,
        },
    )
    return [task_id]


@dataclass
class Bare:
    """A bare worker's queue and the counted client the bare scenarios send with."""

    client: Client
    queue: str
    counter: MessageCounter

    def new_id(self, kind: str) -> str:
        return f"bare-{kind}-{uuid.uuid4().hex[:8]}"


@asynccontextmanager
async def bare_stack(client: Client) -> AsyncIterator[Bare]:
    """A bare worker on a queue of its own (its client's queries are counted too: none)."""
    queue = f"bare-actions-{uuid.uuid4().hex[:8]}"
    counter = MessageCounter()
    async with Worker(
        client,
        task_queue=queue,
        workflows=[BareWorkflow, BareUpdateWorkflow, BareReconciledWorkflow, BareApprovalWorkflow],
        activities=[no_op, unknown_outcome],
    ):
        yield Bare(client=counted_client(client, counter), queue=queue, counter=counter)


def counted_client(client: Client, counter: MessageCounter) -> Client:
    """The same connection and converter, with ``counter`` intercepting."""
    config = client.config()
    return Client(**{**config, "interceptors": [*config["interceptors"], counter]})


async def bare_one_step(calls: Bare) -> list[str]:
    workflow_id = calls.new_id("one-step")
    await calls.client.execute_workflow(
        BareWorkflow.run, "coupon", id=workflow_id, task_queue=calls.queue
    )
    return [workflow_id]


def bare_open_task(count: int) -> Callable[[Bare], Awaitable[list[str]]]:
    async def scenario(calls: Bare) -> list[str]:
        workflow_id = calls.new_id("open")
        handle = await calls.client.start_workflow(
            BareUpdateWorkflow.run, id=workflow_id, task_queue=calls.queue
        )
        for number in range(count):
            await handle.execute_update(BareUpdateWorkflow.call, f"call-{number}")
        await handle.execute_update(BareUpdateWorkflow.close)
        return [workflow_id]

    return scenario


async def bare_parked(calls: Bare) -> list[str]:
    workflow_id = calls.new_id("parked")
    handle = await calls.client.start_workflow(
        BareReconciledWorkflow.run, "transfer", id=workflow_id, task_queue=calls.queue
    )

    async def attempted() -> bool:
        events = [event async for event in handle.fetch_history_events()]
        return any(e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED for e in events)

    await eventually(attempted, what="the bare transfer's attempt ended (outcome unknown)")
    await handle.execute_update(BareReconciledWorkflow.reconcile, "happened")
    return [workflow_id]


async def bare_approval(calls: Bare) -> list[str]:
    workflow_id = calls.new_id("approval")
    handle = await calls.client.start_workflow(
        BareApprovalWorkflow.run, "payout", id=workflow_id, task_queue=calls.queue
    )
    await handle.execute_update(BareApprovalWorkflow.approve, True)
    return [workflow_id]


# ── the run ─────────────────────────────────────────────────────────────────────────


def per_call(more: Counter[str], one: Counter[str], calls: int) -> dict[str, float]:
    """What each call after the first adds: (a task of ``calls`` calls less one of one
    call) / (calls − 1)."""
    return {kind: (more[kind] - one[kind]) / (calls - 1) for kind in KINDS}


def table(results: dict[str, Any]) -> str:
    """The action kinds × scenarios table, onceflow / bare in each cell."""
    header = ["action", *SCENARIOS]
    rows = []
    for kind in [*KINDS, "total"]:
        cells = []
        for scenario in SCENARIOS:
            part = results[scenario]
            cells.append(f"{_count(part['onceflow'][kind])} / {_count(part['bare'][kind])}")
        if kind == "total" or any(cell != "0 / 0" for cell in cells):
            rows.append([kind, *cells])
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        " | ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in [header, *rows]
    ]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def _count(value: float) -> str:
    return f"{value:g}"


async def main(calls: int) -> None:
    if calls < 2:
        raise SystemExit("--calls must be at least 2 (each further call is measured)")
    with tempfile.TemporaryDirectory() as scratch:
        async with embedded_servers(Path(scratch)) as (database_url, env):
            measured_runs: dict[str, dict[str, tuple[Classified, Counter[str]]]] = {}
            async with onceflow_stack(database_url, env.client) as stack:
                # A warm-up task: the first one pays for loading the workflow sandbox.
                await onceflow_one_step(stack)
                scenarios = {
                    "one-step task": onceflow_one_step,
                    "open task, one call": onceflow_open_task(1),
                    "open task, more calls": onceflow_open_task(calls),
                    "parked, then reconciled": onceflow_parked,
                    "approval": onceflow_approval,
                }
                measured_runs["onceflow"] = await measured_arm(
                    env.client, stack.counter, stack, scenarios
                )
            async with bare_stack(env.client) as bare:
                bare_scenarios = {
                    "one-step task": bare_one_step,
                    "open task, one call": bare_open_task(1),
                    "open task, more calls": bare_open_task(calls),
                    "parked, then reconciled": bare_parked,
                    "approval": bare_approval,
                }
                measured_runs["bare"] = await measured_arm(
                    env.client, bare.counter, bare, bare_scenarios
                )
    results: dict[str, Any] = {}
    for scenario in SCENARIOS:
        part: dict[str, Any] = {}
        for arm, runs in measured_runs.items():
            if scenario == "each further call":
                counts = per_call(
                    runs["open task, more calls"][0].actions,
                    runs["open task, one call"][0].actions,
                    calls,
                )
                part[f"{arm}_details"] = [f"a task of {calls} calls less one of one call"]
            else:
                classified, sent = runs[scenario]
                counts = {kind: classified.actions[kind] for kind in KINDS}
                part[f"{arm}_details"] = classified.details
                part[f"{arm}_events"] = dict(sorted(classified.events.items()))
                part[f"{arm}_client_sent"] = dict(sorted(sent.items()))
            counts["total"] = sum(counts[kind] for kind in KINDS)
            part[arm] = counts
        part["ratio"] = part["onceflow"]["total"] / part["bare"]["total"]
        results[scenario] = part
    rendered = table(results)
    print(f"\n== {TITLE} ==  ({machine()}; onceflow / bare, per task)")
    print(rendered)
    print(
        "  ratio onceflow / bare (total): "
        + ", ".join(f"{scenario} {results[scenario]['ratio']:.2f}x" for scenario in SCENARIOS)
    )
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{RESULTS_STEM}.json"
    path.write_text(
        json.dumps(
            {
                "title": TITLE,
                "kinds": [*KINDS, "total"],
                "scenarios": results,
                "calls_in_the_longer_open_task": calls,
                "run": run_info(
                    n_per_arm="one task per scenario (action counts do not vary by run)",
                    concurrency=1,
                    rounds=1,
                    arguments={"calls": calls},
                ),
            },
            indent=2,
        )
        + "\n"
    )
    print(f"  wrote {path.relative_to(RESULTS.parent.parent)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--calls",
        type=int,
        default=3,
        help="calls in the longer open task, from which each further call's actions come",
    )
    asyncio.run(main(parser.parse_args().calls))
