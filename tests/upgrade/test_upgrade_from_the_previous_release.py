"""The upgrade promise, proven from the previous release's own code: tasks it left in flight
finish on this one, each effect made once.

The previous release (CHANGELOG.md's newest entry with a commit) runs from its archive
(``releases/``, see ``release_archive``), extracted to a folder put first on the
``PYTHONPATH`` of its processes, which run with this interpreter; the test checks that its
processes import that code, and this release's import this one. Both run against the same
far sides: the Temporal dev server (its default namespace, where the ``dev_server`` fixture
registered onceflow's search attributes), a new database on the test PostgreSQL, and the
local Stripe-compatible provider, whose ledger is the evidence.

On the previous release (its ``migrate``, its ``principal add``, one worker, one gateway),
an agent leaves, through the gateway's HTTP API: a charge parked after Stripe committed it
and answered 500 (``happened``), one parked after a 500 before the commit (nothing charged:
``did_not_happen``), both while Stripe's PaymentIntents could not be read back, a refund
above the approval threshold awaiting approval, and an open task with one coupon issued.
Then the upgrade, as docs/production.md's "Upgrade" says: the deploy block's first step as
written (this release's ``onceflow migrate`` and the search attribute lines, a no-op here);
the previous release's gateway still serves on the migrated schema, and its worker still
runs there: the agent's last charge meets a 429 that the provider keeps answering, and once
the first 429 is logged the one worker is replaced (the old one stopped at once, so no
attempt can spend the step's five; the 429 is cleared only then, and the task's retry waits
for the new worker); the gateway is replaced after it. On this release, through its gateway
and its CLI: the refund approved, the first parked charge reconciled ``happened`` with the
PaymentIntent in the ledger, the second ``did_not_happen``, one more coupon in the open
task and the task closed, the backing-off charge left to succeed.

Judged at the far sides: every task ended as expected; one PaymentIntent per order in the
ledger (the ``did_not_happen`` one made after the decision), one refund, each coupon once;
the previous gateway's stored answers replay on this one; no workflow task failed in any
of the five histories, each started by the previous release's worker (it completed the
first workflow task) and run by both releases' workers, and each replays on this
release's ``AgentTaskWorkflow``.

It fails where the promise breaks: run from 0.1.0 by hand with 88d66d2 (0.1.0's patches
folded away) as the release after it, that worker's workflow tasks failed with TMPRL1100
and the approval was refused. 40 to 90 s here, as busy as other test runs keep two cores
(processes of two releases, no fixed pauses), 13 s of it the previous gateway's answer to
the last charge: its one worker is stopped, so the gateway's status query waits out its
timeout (12 s on 0.2.0, 5 s on 0.1.0) before the 202.
"""

import asyncio
import os
import signal
import sys
import tarfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from onceflow_devstack.stripe_provider import (
    Fault,
    LedgerEntry,
    ProviderConfig,
    ProviderControl,
    running_provider,
)
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

import onceflow
from onceflow.workflows.visibility import ALL_SEARCH_ATTRIBUTES
from tests.harness import eventually, log_line, replay_every_task
from tests.integration.test_production_topology import (
    SETTINGS_PREFIXES,
    deploy_block,
    fresh_database,
    production_section,
    run_once,
)

from .release_archive import archive_path, archived_commit, previous_release, released_commits

RELEASE = previous_release()
TENANT = "acme"
API_KEY = "sk_test_onceflow_upgrade"
ACCOUNT = "acct_onceflow_upgrade"
PARKING_BUDGET = {
    "max_attempts_per_task": 4,
    "max_attempts_per_step": 2,
    "initial_backoff": "PT0.2S",
    "max_backoff": "PT1S",
}
"""The parked charges' budget: the stored 500 is replayed to the second attempt, which
parks (the default's five attempts would only wait longer for the same)."""
REFUND_ABOVE_THRESHOLD = 15_000
"""Above ``ONCEFLOW_PAYMENTS_REFUND_APPROVAL_ABOVE`` (10,000 by default): needs approval."""
READY = {"worker": "onceflow worker ready on task queue ", "gateway": "onceflow gateway ready on "}
HANG = 120.0
"""Bound of every wait: long enough for a slow core, short enough to report a hang."""


@dataclass
class Service:
    """A long-running ``onceflow`` process of one release."""

    name: str
    process: asyncio.subprocess.Process
    log_path: Path

    def log(self) -> str:
        """Everything the process wrote so far."""
        return self.log_path.read_text(errors="replace")

    @property
    def identity(self) -> str:
        """How the identity Temporal records for it in a history starts (the SDK's default
        is ``pid@host``)."""
        return f"{self.process.pid}@"

    def url(self) -> str:
        """A gateway's address, from the line it printed when ready."""
        [line] = [line for line in self.log().splitlines() if READY["gateway"] in line]
        return line.split(READY["gateway"], 1)[1].split()[0].rstrip("/")

    async def stop(self) -> None:
        """SIGTERM, as a supervisor stops it: it must drain and exit 0."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.wait_for(self.process.wait(), timeout=HANG)
        except TimeoutError:
            self.process.kill()
            code = await self.process.wait()
        assert code == 0, f"{self.name} exited {code} on SIGTERM:\n{self.log()[-4000:]}"


@dataclass
class Release:
    """One release's code, and how its processes are run."""

    version: str
    env: dict[str, str]
    folder: Path
    """Where its processes run: not the repository, whose ``onceflow/`` would come first
    on ``sys.path`` (``python -m`` puts the working directory there)."""
    started: list[Service] = field(default_factory=list)

    async def run(self, *arguments: str) -> str:
        """``onceflow ARGUMENTS`` to its end; its standard output."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "onceflow.cli",
            *arguments,
            cwd=self.folder,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), timeout=HANG)
        assert process.returncode == 0, (
            f"{self.version}: onceflow {' '.join(arguments)} exited {process.returncode}:\n"
            f"{err.decode(errors='replace')}"
        )
        return out.decode()

    async def code(self) -> tuple[str, str]:
        """``onceflow.__version__`` and ``onceflow.__file__`` as its processes import them."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "import onceflow; print(onceflow.__version__); print(onceflow.__file__)",
            cwd=self.folder,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(process.communicate(), timeout=HANG)
        version, path = out.decode().split()
        return version, path

    async def start(self, service: str, *arguments: str) -> Service:
        """Start ``onceflow SERVICE ARGUMENTS`` and wait until it says it is ready."""
        log_path = self.folder / f"{service}-{self.version}-{len(self.started)}.log"
        with log_path.open("wb") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "onceflow.cli",
                service,
                *arguments,
                cwd=self.folder,
                env=self.env,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
            )
        started = Service(f"{service} {self.version}", process, log_path)
        self.started.append(started)
        await log_line(process, log_path, READY[service], timeout=HANG)
        return started

    async def stop_all(self) -> None:
        """Stop what is still running (after a failure)."""
        for service in self.started:
            if service.process.returncode is None:
                service.process.kill()
                await service.process.wait()


@dataclass
class Agent:
    """An agent (or an operator's view) on one gateway, over HTTP."""

    http: httpx.AsyncClient
    url: str
    api_key: str
    sent: dict[str, "Sent"] = field(default_factory=dict)
    """Its requests sent with a key, and the last answer of each, by key."""

    async def post(self, path: str, body: dict[str, Any], key: str | None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.api_key}"}
        if key is not None:
            headers["Idempotency-Key"] = key
        answer = await self.http.post(f"{self.url}{path}", json=body, headers=headers)
        if key is not None:
            self.sent[key] = Sent(path, body, key, answer)
        return answer

    async def task(self, task_id: str) -> dict[str, Any]:
        answer = await self.http.get(
            f"{self.url}/v1/tasks/{task_id}", headers={"Authorization": f"Bearer {self.api_key}"}
        )
        assert answer.status_code == 200, answer.text
        task: dict[str, Any] = answer.json()
        return task

    async def until(self, task_id: str, *states: str) -> dict[str, Any]:
        """Poll the task until its state is one of ``states``."""
        return await eventually(
            lambda: self.task(task_id),
            until=lambda task: task["state"] in states,
            what=f"task {task_id} reaches {' or '.join(states)}",
            timeout=HANG,
        )

    async def until_answered(self, path: str, body: dict[str, Any], key: str) -> httpx.Response:
        """Send the request until its answer is final (200), as an agent retries a 202."""
        return await eventually(
            lambda: self.post(path, body, key),
            until=lambda answer: answer.status_code != 202,
            what=f"{path} with key {key} answers",
            timeout=HANG,
            interval=0.2,
        )


def charge(order: str, amount: int) -> dict[str, Any]:
    """``charge_payment``'s arguments for an order."""
    return {
        "amount": amount,
        "currency": "eur",
        "customer": "cus_upgrade",
        "payment_method": "pm_card_visa",
        "order_id": order,
    }


def charges_of(ledger: list[LedgerEntry], order: str) -> list[LedgerEntry]:
    return [e for e in ledger if e.kind == "charge" and e.metadata.get("order_id") == order]


async def test_tasks_the_previous_release_left_in_flight_finish_on_this_one(
    dev_server: WorkflowEnvironment, postgres_url: str, task_queue: str, tmp_path: Path
) -> None:
    archive = archive_path(RELEASE)
    assert archive.exists() and archived_commit(archive).startswith(released_commits()[RELEASE]), (
        f"{archive.name} is not the commit CHANGELOG.md names for {RELEASE}: run "
        f"`python -m tests.upgrade.release_archive {RELEASE}` and commit it"
    )
    extracted = tmp_path / f"onceflow-{RELEASE}"
    with tarfile.open(archive) as opened:
        opened.extractall(extracted, filter="data")

    async with AsyncExitStack() as stack:
        database_url = await stack.enter_async_context(fresh_database(postgres_url))
        provider = await stack.enter_async_context(running_provider(ProviderConfig()))
        control = await stack.enter_async_context(ProviderControl(provider.base_url))
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=HANG))
        settings = {
            "TEMPORAL_ADDRESS": dev_server.client.service_client.config.target_host,
            "TEMPORAL_NAMESPACE": dev_server.client.namespace,
            "DATABASE_URL": database_url,
            "ONCEFLOW_TASK_QUEUE": task_queue,
            "ONCEFLOW_BUILTIN_TOOLS": "charge_payment,refund_payment,issue_coupon",
            "STRIPE_API_KEY": API_KEY,
            "STRIPE_API_BASE": provider.base_url,
            "ONCEFLOW_STRIPE_ACCOUNT": ACCOUNT,  # the same names in both releases
            # A 202 after a second: the agent polls (the default waits 10 s per request).
            "ONCEFLOW_GATEWAY_REPLAY_WAIT_SECONDS": "1",
            "ONCEFLOW_SHUTDOWN_GRACE_SECONDS": "10",
            "PYTHONUNBUFFERED": "1",
            # The deploy block's ``onceflow`` and ``temporal`` are this environment's.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        inherited = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(SETTINGS_PREFIXES)
        }
        current = {**inherited, **settings}
        paths = [p for p in current.get("PYTHONPATH", "").split(os.pathsep) if p]
        previous = {**current, "PYTHONPATH": os.pathsep.join([str(extracted), *paths])}
        old = Release(RELEASE, previous, tmp_path)
        new = Release(onceflow.__version__, current, tmp_path)
        stack.push_async_callback(new.stop_all)
        stack.push_async_callback(old.stop_all)

        # Each release's processes run its own code, never this one's twice.
        assert await old.code() == (RELEASE, str(extracted / "onceflow" / "__init__.py"))
        assert await new.code() == (onceflow.__version__, onceflow.__file__)
        assert RELEASE != onceflow.__version__

        left = await on_the_previous_release(old, control, http)
        await upgrade(new, control, http, tmp_path, left)
        await on_this_release(new, control, http, database_url, left)
        await judge_the_histories(dev_server, left)


@dataclass(frozen=True)
class Sent:
    """A request sent with an ``Idempotency-Key``, and the last answer it got."""

    path: str
    body: dict[str, Any]
    key: str
    answer: httpx.Response


@dataclass
class LeftInFlight:
    """What the previous release left running, and what its gateway answered."""

    api_key: str = ""
    happened: str = ""
    did_not_happen: str = ""
    refund: str = ""
    refund_charge: str = ""
    """The PaymentIntent the refund names."""
    open_task: str = ""
    backing_off: str = ""
    sent: dict[str, Sent] = field(default_factory=dict)
    """Every request sent with a key to the previous gateway, and its last answer, by key."""
    old_worker: Service | None = None
    old_gateway: Service | None = None
    new_worker: Service | None = None
    new_gateway: Service | None = None

    @property
    def ids(self) -> list[str]:
        return [
            self.happened,
            self.did_not_happen,
            self.refund,
            self.open_task,
            self.backing_off,
        ]


async def on_the_previous_release(
    old: Release, control: ProviderControl, http: httpx.AsyncClient
) -> LeftInFlight:
    """The previous release deployed, and an agent's tasks left waiting on it."""
    left = LeftInFlight()
    await old.run("migrate")
    added = await old.run(
        "principal", "add", "--tenant", TENANT, "--name", "agent-1", "--tools", "*"
    )
    left.api_key = added.strip().splitlines()[-1]
    left.old_worker = await old.start("worker")
    left.old_gateway = await old.start("gateway", "--port", "0")
    agent = Agent(http, left.old_gateway.url(), left.api_key, left.sent)

    # Two charges parked: Stripe stores a 500 under the key and the customer's
    # PaymentIntents cannot be read back (list and search answer 503), so no attempt or
    # look-up can tell whether the charge happened. (The list is consistent: since 0.2.0 a
    # look-up that can read it finds the charge, or proves it absent, and nothing parks.)
    parked_ids = {}
    for name, fault in (
        ("happened", Fault.ERROR_500_AFTER_COMMIT),
        ("did_not_happen", Fault.ERROR_500_BEFORE_COMMIT),
    ):
        await control.add_fault(fault, path_prefix="/v1/payment_intents", times=1)
        await control.add_fault(
            Fault.ERROR_503, method="GET", path_prefix="/v1/payment_intents", times=None
        )
        plan = {
            "steps": [
                {"step_id": "pay", "tool": "charge_payment", "arguments": charge(name, 9900)}
            ],
            "budget": PARKING_BUDGET,
        }
        started = await agent.post("/v1/tasks", plan, f"checkout-{name}")
        assert started.status_code in (200, 202), started.text
        task_id = started.json()["task_id"]
        parked = await agent.until(task_id, "parked", "succeeded", "failed")
        assert parked["state"] == "parked", parked
        await control.clear_faults()
        parked_ids[name] = task_id
    left.happened, left.did_not_happen = parked_ids["happened"], parked_ids["did_not_happen"]
    ledger = await control.ledger()
    assert len(charges_of(ledger, "happened")) == 1 and charges_of(ledger, "did_not_happen") == []

    # A charge, then a refund of most of it, which waits for a person.
    path, body = "/v1/tools/charge_payment/calls", charge("refund", 25_000)
    charged = await agent.until_answered(path, body, "checkout-refund")
    assert charged.status_code == 200 and charged.json()["state"] == "succeeded", charged.text
    left.refund_charge = charged.json()["steps"][0]["resource_id"]
    refund = {"payment_intent": left.refund_charge, "amount": REFUND_ABOVE_THRESHOLD}
    asked = await agent.post("/v1/tools/refund_payment/calls", refund, "refund-1")
    assert asked.status_code == 202, asked.text
    left.refund = asked.json()["task_id"]
    await agent.until(left.refund, "awaiting_approval")

    # An open task with one call done.
    opened = await agent.post("/v1/tasks", {"open": {}}, "session-1")
    assert opened.status_code == 201, opened.text
    left.open_task = opened.json()["task_id"]
    path = f"/v1/tasks/{left.open_task}/calls"
    body = {"tool": "issue_coupon", "arguments": {"user_id": "u-42", "coupon_id": "WELCOME10"}}
    issued = await agent.until_answered(path, body, "coupon-welcome")
    assert issued.status_code == 200 and issued.json()["state"] == "succeeded", issued.text
    return left


async def upgrade(
    new: Release,
    control: ProviderControl,
    http: httpx.AsyncClient,
    folder: Path,
    left: LeftInFlight,
) -> None:
    """docs/production.md's upgrade: the deploy block's first step, the worker replaced,
    then the gateway; the agent's last charge backs off across the worker's replacement."""
    assert left.old_worker is not None and left.old_gateway is not None
    first_step = [
        command
        for command in deploy_block(production_section())
        if command.words[:2] == ("onceflow", "migrate") or command.words[:1] == ("temporal",)
    ]
    assert [c.words[:2] for c in first_step][:1] == [("onceflow", "migrate")], first_step
    assert len(first_step) == 1 + len(ALL_SEARCH_ATTRIBUTES), first_step
    for command in first_step:
        await run_once(command, new.env, folder)

    # The previous release serves on the migrated schema: its stored answers, its status.
    agent = Agent(http, left.old_gateway.url(), left.api_key, left.sent)
    assert (await http.get(f"{agent.url}/readyz")).status_code == 200
    assert (await agent.task(left.open_task))["open"] is True
    first = left.sent["checkout-refund"]
    again = await agent.post(first.path, first.body, first.key)
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.answer.json()

    # The last charge meets a 429 the provider keeps answering; once the first is logged
    # the worker is stopped, then the 429 cleared: the task waits in its backoff. (On 0.2.0
    # each 429 spends one of the step's attempts; from 0.3.0 on a 429 spends none and holds
    # every send to the provider for its Retry-After or 1 s: this release's worker must
    # meet no 429 here, or its sends wait for the provider, not the task's backoff.)
    await control.add_fault(Fault.RATE_LIMIT_429, path_prefix="/v1/payment_intents", times=None)
    sent = asyncio.create_task(
        agent.post("/v1/tools/charge_payment/calls", charge("backing-off", 3100), "checkout-429")
    )
    await eventually(
        control.requests,
        until=lambda records: any(
            r.method == "POST" and r.path == "/v1/payment_intents" and r.status == 429
            for r in records
        ),
        what="the last charge's first POST is answered 429",
        timeout=HANG,
    )
    await left.old_worker.stop()
    await control.clear_faults()
    answered = await sent
    assert answered.status_code == 202, answered.text
    left.backing_off = answered.json()["task_id"]

    left.new_worker = await new.start("worker")
    await left.old_gateway.stop()
    left.new_gateway = await new.start("gateway", "--port", "0")


async def on_this_release(
    new: Release,
    control: ProviderControl,
    http: httpx.AsyncClient,
    database_url: str,
    left: LeftInFlight,
) -> None:
    """People decide and the agent goes on, on this release; what the far sides hold."""
    assert left.new_worker is not None and left.new_gateway is not None
    agent = Agent(http, left.new_gateway.url(), left.api_key)

    await new.run("approve", left.refund, "--step", "1", "--approve", "--reason", "RMA-7")
    [charged] = charges_of(await control.ledger(), "happened")
    await new.run(
        "reconcile", left.happened, "--step", "pay", "--decision", "happened",
        "--resource-id", charged.object_id, "--reason", "in the Stripe dashboard",
    )  # fmt: skip
    decided_at = time.time()
    await new.run(
        "reconcile", left.did_not_happen, "--step", "pay", "--decision", "did_not_happen",
        "--reason", "not in the Stripe dashboard",
    )  # fmt: skip

    path = f"/v1/tasks/{left.open_task}/calls"
    body = {"tool": "issue_coupon", "arguments": {"user_id": "u-42", "coupon_id": "LOYAL5"}}
    issued = await agent.until_answered(path, body, "coupon-loyal")
    assert issued.status_code == 200 and issued.json()["state"] == "succeeded", issued.text
    closed = await agent.post(f"/v1/tasks/{left.open_task}/close", {}, None)
    assert closed.status_code == 200, closed.text

    ended = {
        task_id: await agent.until(task_id, "succeeded", "failed", "closed") for task_id in left.ids
    }
    states = {task_id: task["state"] for task_id, task in ended.items()}
    assert states == {
        left.happened: "succeeded",
        left.did_not_happen: "succeeded",
        left.refund: "succeeded",
        left.open_task: "closed",
        left.backing_off: "succeeded",
    }, {task_id: task.get("failure_reason") for task_id, task in ended.items()}
    assert [s["state"] for s in ended[left.open_task]["steps"]] == ["succeeded", "succeeded"]
    # The backing-off charge: 429s on the previous release, within the step's budget, and
    # the attempt after them on this one.
    attempts = [a["outcome"] for a in ended[left.backing_off]["steps"][0]["attempts"]]
    assert attempts[-1] == "succeeded" and set(attempts[:-1]) == {"transient"}, attempts

    # The provider's ledger: one PaymentIntent per order, one refund.
    ledger = await control.ledger()
    for order in ("happened", "did_not_happen", "refund", "backing-off"):
        assert len(charges_of(ledger, order)) == 1, (order, ledger)
    assert ended[left.happened]["steps"][0]["resource_id"] == charged.object_id
    [made] = charges_of(ledger, "did_not_happen")
    assert made.committed_at > decided_at
    assert ended[left.did_not_happen]["steps"][0]["resource_id"] == made.object_id
    [refunded] = [entry for entry in ledger if entry.kind == "refund"]
    assert (refunded.payment_intent, refunded.amount) == (
        left.refund_charge,
        REFUND_ABOVE_THRESHOLD,
    )
    assert len(ledger) == 5
    async with await psycopg.AsyncConnection.connect(database_url) as connection:
        cursor = await connection.execute(
            "SELECT coupon_id FROM coupon_issuances WHERE user_id = 'u-42' ORDER BY coupon_id"
        )
        assert await cursor.fetchall() == [("LOYAL5",), ("WELCOME10",)]

    # Every request the agent sent the previous gateway, sent again with its key: the
    # stored answer, the same as the previous gateway's where that one was final.
    not_replayed = []
    for key, first in left.sent.items():
        again = await agent.post(first.path, first.body, key)
        if (
            again.status_code != 200
            or again.headers.get("Idempotent-Replayed") != "true"
            or first.answer.status_code == 200
            and again.json() != first.answer.json()
        ):
            not_replayed.append(f"{key} ({first.path}): {again.status_code} {again.text[:300]}")
    assert not_replayed == [], "\n".join(not_replayed)

    await left.new_gateway.stop()
    await left.new_worker.stop()


async def judge_the_histories(dev_server: WorkflowEnvironment, left: LeftInFlight) -> None:
    """Each history: started by the previous release (its worker completed the first
    workflow task), run by both workers, no workflow task failed, and it replays on this
    release's workflow."""
    assert left.old_worker is not None and left.new_worker is not None
    for task_id in left.ids:
        history = await dev_server.client.get_workflow_handle(task_id).fetch_history()
        failed = [
            event.workflow_task_failed_event_attributes
            for event in history.events
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
        ]
        assert failed == [], (task_id, failed)
        # Who completed each workflow task, in order: the proof of which release started
        # the task (0.1.0's tasks record a marker at their start, later releases' none).
        ran = [
            event.workflow_task_completed_event_attributes.identity.split("@")[0] + "@"
            for event in history.events
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
        ]
        assert ran[0] == left.old_worker.identity, (task_id, ran)
        assert set(ran) == {left.old_worker.identity, left.new_worker.identity}, (task_id, ran)
    report = await replay_every_task(dev_server.client, "the upgrade", workflow_ids=left.ids)
    assert (report.replayed, report.diverged, report.not_replayable) == (len(left.ids), [], [])
