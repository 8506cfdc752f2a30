"""The ledgerpay example end to end: a second payment provider, whose idempotency rules
are not Stripe's, brought to onceflow from outside and registered by configuration.

The example package is installed offline into a private folder, like any third-party
package; worker and gateway processes load its tools through the ``onceflow.tools`` entry
point because ``ONCEFLOW_TOOLS=ledgerpay``, and nothing in this process registers them.
The test plays the agent through the Python client, one idempotency key per logical call
and the same key for its retries; ledgerpay's own ledger (charges, refunds and every
creating request it received) is the judge, never onceflow's records alone.

Two onceflow stacks share the service, PostgreSQL and Temporal: one with ledgerpay's
documented key window (keys kept an hour), and one whose ``LEDGERPAY_KEY_RETENTION`` and
``LEDGERPAY_RETENTION_MARGIN`` leave a two-second window, so that a retry past the window
happens without waiting an hour. There the service holds the first request until the
window has closed (its timer fired in the task's history) and moves its clock on by two
hours, so that it really forgot the key: a blind repeat would charge twice.
"""

import ast
import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from onceflow_client import OnceflowClient, TaskResult
from temporalio.testing import WorkflowEnvironment

from tests.harness import (
    HANG_SECONDS,
    REPO,
    eventually,
    key_window_closed,
    onceflow_command,
    replay_tools_from,
    workflow_idle,
)

from .installation import install_example, start, stop_all, wait_for

EXAMPLE = REPO / "examples" / "ledgerpay"
TOOLS = "ledgerpay_charge,ledgerpay_refund"
SHORT_WINDOW = {
    # Keys "kept" 3 s, sent again only within 3 - 1 = 2 s of their first send.
    "LEDGERPAY_KEY_RETENTION": "PT3S",
    "LEDGERPAY_RETENTION_MARGIN": "PT1S",
    "LEDGERPAY_SETTLE_TIME": "PT1S",
    # The service holds a request until the test has seen the window close.
    "LEDGERPAY_REQUEST_TIMEOUT": "PT30S",
    "LEDGERPAY_ATTEMPT_TIMEOUT": "PT65S",
}
WAITING = frozenset({"running"})
"""Task states an agent asks again about, with the same key."""


def a_charge(order: str, **changes: Any) -> dict[str, Any]:
    """The arguments of one ``ledgerpay_charge`` call."""
    return {
        "amount": 4200,
        "currency": "eur",
        "customer": "cus_ledger7",
        "payment_method": "pm_visa",
        "order_id": order,
        **changes,
    }


@dataclass(frozen=True)
class Ledgerpay:
    """The running service: its ledger, faults and clock, as a test drives them."""

    url: str

    def ledger(self) -> dict[str, list[dict[str, Any]]]:
        """Every charge, refund and creating request the service has seen."""
        response = httpx.get(f"{self.url}/_ledger", timeout=HANG_SECONDS)
        response.raise_for_status()
        ledger: dict[str, list[dict[str, Any]]] = response.json()
        return ledger

    def charges(self, reference: str) -> list[dict[str, Any]]:
        return [row for row in self.ledger()["charges"] if row["reference"] == reference]

    def refunds(self, reference: str) -> list[dict[str, Any]]:
        return [row for row in self.ledger()["refunds"] if row["reference"] == reference]

    def requests(self, reference: str) -> list[dict[str, Any]]:
        """The creating requests that carried ``reference`` (every one, answered or not)."""
        return [row for row in self.ledger()["requests"] if row["reference"] == reference]

    def arm(self, **faults: int) -> None:
        httpx.post(f"{self.url}/_faults", json=faults, timeout=HANG_SECONDS).raise_for_status()

    def faults(self) -> dict[str, int]:
        armed: dict[str, int] = httpx.get(f"{self.url}/_faults", timeout=HANG_SECONDS).json()
        return armed

    def release(self) -> None:
        httpx.post(f"{self.url}/_release", timeout=HANG_SECONDS).raise_for_status()

    def advance_clock(self, seconds: float) -> None:
        payload = {"advance_seconds": seconds}
        httpx.post(f"{self.url}/_clock", json=payload, timeout=HANG_SECONDS).raise_for_status()


@dataclass(frozen=True)
class Stack:
    """A worker and a gateway serving the installed example's tools."""

    gateway_url: str
    api_key: str
    env: dict[str, str]
    """What the operator's CLI needs."""

    def agent(self) -> OnceflowClient:
        return OnceflowClient(self.gateway_url, api_key=self.api_key, timeout=60)

    def reconcile(self, task_id: str, *arguments: str) -> subprocess.CompletedProcess[str]:
        """``onceflow reconcile`` as an operator runs it."""
        return subprocess.run(
            onceflow_command("reconcile", task_id, "--operator", "ops", *arguments),
            cwd=REPO,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=60,
        )


async def call_until_answered(
    stack: Stack,
    tool: str,
    arguments: dict[str, Any],
    *,
    key: str,
    lose: int = 0,
) -> tuple[TaskResult, int]:
    """Call as an agent does: the same key for every retry, again while the task runs;
    the first ``lose`` answers are thrown away (lost on their way back). Returns the
    answer and the number of calls made."""
    async with stack.agent() as agent:
        for calls in range(1, 31):
            answer = await agent.call_tool(tool, arguments, idempotency_key=key, retries=0)
            if calls > lose and answer.state not in WAITING:
                return answer, calls
    raise AssertionError(f"{tool} under {key} never ended: last {answer.state}")


async def task_status(stack: Stack, task_id: str) -> dict[str, Any]:
    async with stack.agent() as agent:
        return await agent.status(task_id)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The example installed offline into a private folder, and the PYTHONPATH naming it."""
    root = tmp_path_factory.mktemp("ledgerpay")
    site = install_example(EXAMPLE, root)
    replay_tools_from(site, "ledgerpay")  # its tasks replay at the end of the run
    return root, os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))


@pytest.fixture(scope="module")
def ledgerpay(installed: tuple[Path, str]) -> Iterator[Ledgerpay]:
    root, python_path = installed
    log = root / "service.log"
    service = start(
        [sys.executable, "-m", "ledgerpay.service", "--port", "0"], {"PYTHONPATH": python_path}, log
    )
    try:
        yield Ledgerpay(wait_for(service, log, r"ready on (\S+)").group(1))
    finally:
        stop_all([service])


@contextmanager
def running_stack(
    name: str,
    installed: tuple[Path, str],
    postgres_url: str,
    dev_server: WorkflowEnvironment,
    service: Ledgerpay,
    settings: dict[str, str],
) -> Iterator[Stack]:
    """A worker and a gateway told by configuration alone to load the example's tools
    (with ``settings``), and a principal that may call them."""
    root, python_path = installed
    logs = root / name
    logs.mkdir()
    temporal = dev_server.client.service_client.config.target_host
    env = {
        "PYTHONPATH": python_path,
        "PYTHONUNBUFFERED": "1",
        "DATABASE_URL": postgres_url,
        "TEMPORAL_ADDRESS": temporal,
        "ONCEFLOW_TASK_QUEUE": f"ledgerpay-{name}-{uuid.uuid4().hex[:8]}",
        # Never join services a developer's own `onceflow dev` left recorded.
        "ONCEFLOW_STATE_DIR": str(logs / "state"),
        "ONCEFLOW_SHUTDOWN_GRACE_SECONDS": "2",
        # A call still running answers 202 after this wait, and the agent asks again.
        "ONCEFLOW_GATEWAY_REPLAY_WAIT_SECONDS": "3",
        "ONCEFLOW_TOOLS": "ledgerpay",
        # No Stripe key or deployment target here: serve the local built-in tools only.
        "ONCEFLOW_BUILTIN_TOOLS": "issue_coupon,create_order,send_email",
        "LEDGERPAY_URL": service.url,
        **settings,
    }
    processes: list[subprocess.Popen[bytes]] = []
    try:
        worker = start(onceflow_command("worker"), env, logs / "worker.log")
        gateway = start(onceflow_command("gateway", "--port", "0"), env, logs / "gateway.log")
        processes += [worker, gateway]
        # `principal add` refuses tools it does not know: it loads them from config too.
        added = subprocess.run(
            onceflow_command(
                "principal",
                "add",
                "--tenant",
                f"t-{uuid.uuid4().hex[:8]}",
                "--name",
                "agent",
                "--tools",
                TOOLS,
            ),  # fmt: skip
            cwd=REPO,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert added.returncode == 0, added.stderr
        wait_for(worker, logs / "worker.log", "onceflow worker ready")
        gateway_url = wait_for(gateway, logs / "gateway.log", r"gateway ready on (\S+)").group(1)
        yield Stack(
            gateway_url=gateway_url,
            api_key=added.stdout.strip().splitlines()[-1],
            env={"PYTHONPATH": python_path, "TEMPORAL_ADDRESS": temporal},
        )
    finally:
        stop_all(processes)


@pytest.fixture(scope="module")
def stack(
    installed: tuple[Path, str],
    postgres_url: str,
    dev_server: WorkflowEnvironment,
    ledgerpay: Ledgerpay,
) -> Iterator[Stack]:
    """The tools with ledgerpay's documented key window: an hour, less ten minutes."""
    with running_stack("hour", installed, postgres_url, dev_server, ledgerpay, {}) as running:
        yield running


@pytest.fixture(scope="module")
def short_stack(
    installed: tuple[Path, str],
    postgres_url: str,
    dev_server: WorkflowEnvironment,
    ledgerpay: Ledgerpay,
) -> Iterator[Stack]:
    """The tools with a two-second key window (``SHORT_WINDOW``)."""
    with running_stack(
        "seconds", installed, postgres_url, dev_server, ledgerpay, SHORT_WINDOW
    ) as running:
        yield running


# ── the far side's rules ────────────────────────────────────────────────────────────


async def test_service_keeps_keys_an_hour_stores_no_500s_and_reads_references_consistently(
    ledgerpay: Ledgerpay,
) -> None:
    reference = f"ref-{uuid.uuid4().hex}"
    body = {
        "amount": 500,
        "currency": "eur",
        "customer": "cus_rules",
        "payment_method": "pm_visa",
        "reference": reference,
    }
    key = {"Idempotency-Key": f"k-{reference}"}
    async with httpx.AsyncClient(base_url=ledgerpay.url, timeout=HANG_SECONDS) as http:
        first = await http.post("/charges", json=body, headers=key)
        # Read-after-write: the reference finds the charge the moment it committed.
        found = (await http.get("/charges", params={"reference": reference})).json()["charges"]
        again = await http.post("/charges", json=body, headers=key)
        other = await http.post("/charges", json={**body, "amount": 501}, headers=key)

        assert first.status_code == 201 and [row["id"] for row in found] == [first.json()["id"]]
        assert again.json() == first.json() and again.headers["Idempotent-Replayed"] == "true"
        assert again.headers["Original-Request"] == first.headers["Request-Id"]
        assert other.status_code == 422

        # No stored 500s: the failed request committed nothing and the key is free again.
        failing = {**body, "reference": f"{reference}-500"}
        failing_key = {"Idempotency-Key": f"k-{reference}-500"}
        ledgerpay.arm(fail_without_commit=1)
        failed = await http.post("/charges", json=failing, headers=failing_key)
        assert failed.status_code == 500 and ledgerpay.charges(failing["reference"]) == []
        executed = await http.post("/charges", json=failing, headers=failing_key)
        assert executed.status_code == 201 and "Idempotent-Replayed" not in executed.headers

        # A key whose first request is still running is refused, not run twice.
        held_body = {**body, "reference": f"{reference}-held"}
        held_key = {"Idempotency-Key": f"k-{reference}-held"}
        ledgerpay.arm(hold_requests=1)
        running = asyncio.create_task(http.post("/charges", json=held_body, headers=held_key))
        try:
            await eventually(ledgerpay.faults, until=lambda f: f["held"] == 1, what="held")
            repeat = await http.post("/charges", json=held_body, headers=held_key)
        finally:
            ledgerpay.release()
        assert repeat.status_code == 409 and (await running).status_code == 201

        # An hour later the key is forgotten: the same request is a second charge. This is
        # what the tools' key window guards against.
        ledgerpay.advance_clock(3601)
        later = await http.post("/charges", json=body, headers=key)
        assert later.status_code == 201 and later.json()["id"] != first.json()["id"]

        declined = {**body, "payment_method": "pm_card_declined", "reference": f"{reference}-d"}
        refused = await http.post(
            "/charges", json=declined, headers={"Idempotency-Key": f"k-{reference}-d"}
        )
        refund = {"charge": first.json()["id"], "amount": 501, "reference": f"{reference}-r"}
        too_much = await http.post("/refunds", json=refund)

    assert refused.status_code == 402 and ledgerpay.charges(declined["reference"]) == []
    assert too_much.status_code == 422 and too_much.json()["error"]["type"] == "nothing_to_refund"
    assert len(ledgerpay.charges(reference)) == 2
    assert len(ledgerpay.charges(failing["reference"])) == 1
    assert len(ledgerpay.charges(held_body["reference"])) == 1


def test_the_example_imports_only_onceflows_public_api() -> None:
    """What the example takes from onceflow: the tool API and the settings base, never a
    private module (the house's layering rule, applied to a package from outside)."""
    taken: set[str] = set()
    for path in sorted((EXAMPLE / "ledgerpay").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            taken |= {name for name in names if name.split(".")[0] == "onceflow"}
    assert taken, "the example uses onceflow"
    assert {name.rsplit(".", 1)[0] for name in taken} <= {"onceflow.tools", "onceflow.settings"}
    assert not [name for name in taken if any(part.startswith("_") for part in name.split("."))]


async def test_the_gateway_serves_the_configured_tools_with_their_contracts(
    stack: Stack,
) -> None:
    async with stack.agent() as agent:
        tools = {tool["name"]: tool for tool in await agent.list_tools()}

    for name in TOOLS.split(","):
        assert tools[name]["dedupe"] == "provider_idempotency_key"
        assert tools[name]["annotations"]["idempotentHint"] is True
    assert tools["ledgerpay_charge"]["annotations"]["destructiveHint"] is False
    assert tools["ledgerpay_refund"]["annotations"]["destructiveHint"] is True


# ── inside the key window ───────────────────────────────────────────────────────────


async def test_a_charge_whose_answer_is_lost_is_found_by_reference_not_sent_again(
    stack: Stack, ledgerpay: Ledgerpay
) -> None:
    # ledgerpay commits the charge and loses its answer; the agent loses onceflow's too.
    ledgerpay.arm(drop_responses=1)

    answer, calls = await call_until_answered(
        stack, "ledgerpay_charge", a_charge("o-lost"), key=f"pay-{uuid.uuid4().hex}", lose=1
    )

    assert answer.state == "succeeded" and calls >= 2
    status = await task_status(stack, answer.task_id)
    [step] = status["steps"]
    reference = step["evidence"]["charge_key_digest"]
    assert [a["outcome"] for a in step["attempts"]] == ["unknown", "succeeded"]
    assert step["result"]["found_by"] == "reference"
    assert [row["id"] for row in ledgerpay.charges(reference)] == [step["resource_id"]]
    # The second attempt read the reference and sent nothing: one request, one charge.
    assert [row["answer"] for row in ledgerpay.requests(reference)] == [201]
    assert ledgerpay.faults()["drop_responses"] == 0
    assert status["policies"]["ledgerpay_charge"]["key_retention"] == "PT1H"


async def test_a_500_that_committed_nothing_is_sent_again_under_its_key_and_charges_once(
    stack: Stack, ledgerpay: Ledgerpay
) -> None:
    # Twice ledgerpay fails without committing; it stores neither failure under the key.
    ledgerpay.arm(fail_without_commit=2)

    answer, _ = await call_until_answered(
        stack, "ledgerpay_charge", a_charge("o-500"), key=f"pay-{uuid.uuid4().hex}"
    )

    assert answer.state == "succeeded"
    [step] = (await task_status(stack, answer.task_id))["steps"]
    reference = step["evidence"]["charge_key_digest"]
    assert [a["outcome"] for a in step["attempts"]] == ["unknown", "unknown", "succeeded"]
    # The same key (one reference) three times: two failures, then it executed afresh,
    # where Stripe would have replayed the first 500 for as long as it keeps the key.
    requests = ledgerpay.requests(reference)
    assert [row["answer"] for row in requests] == [500, 500, 201]
    assert not any(row.get("replayed") for row in requests)
    assert [row["id"] for row in ledgerpay.charges(reference)] == [step["resource_id"]]
    assert step["result"]["found_by"] == "response"


async def test_a_refund_of_a_charge_happens_once_under_the_agents_retries(
    stack: Stack, ledgerpay: Ledgerpay
) -> None:
    steps = [
        {"step_id": "pay", "tool": "ledgerpay_charge", "arguments": a_charge("o-refund")},
        {"step_id": "refund", "tool": "ledgerpay_refund", "arguments": {"charge_step": "pay"}},
    ]
    key = f"refund-{uuid.uuid4().hex}"
    # Both the charge's and the refund's answers are lost at ledgerpay (both committed).
    ledgerpay.arm(drop_responses=2)

    async with stack.agent() as agent:
        await agent.start_task(steps, idempotency_key=key, retries=0)  # its answer is lost
        answer = await agent.start_task(steps, idempotency_key=key, retries=0)
        while answer.state in WAITING:
            answer = await agent.start_task(steps, idempotency_key=key, retries=0)
        # A later call with a new key is a new intent: a second refund of the same charge.
        again, _ = await call_until_answered(
            stack,
            "ledgerpay_refund",
            {"charge": answer.steps[0]["resource_id"]},
            key=f"refund-again-{uuid.uuid4().hex}",
        )

    assert answer.state == "succeeded"
    pay, refunded = (await task_status(stack, answer.task_id))["steps"]
    charges = ledgerpay.charges(pay["evidence"]["charge_key_digest"])
    refunds = ledgerpay.refunds(refunded["evidence"]["refund_key_digest"])
    assert [row["id"] for row in charges] == [pay["resource_id"]]
    assert [(row["id"], row["charge"]) for row in refunds] == [
        (refunded["resource_id"], pay["resource_id"])
    ]
    [charge] = charges
    assert charge["amount_refunded"] == charge["amount"] == 4200
    for step, reference in ((pay, "charge_key_digest"), (refunded, "refund_key_digest")):
        assert [a["outcome"] for a in step["attempts"]] == ["unknown", "succeeded"]
        assert len(ledgerpay.requests(step["evidence"][reference])) == 1
    # ledgerpay refused the second refund for good: one attempt, no effect, no repeat.
    assert again.state == "failed"
    [refused] = (await task_status(stack, again.task_id))["steps"]
    assert [a["outcome"] for a in refused["attempts"]] == ["rejected"]
    assert "nothing_to_refund" in refused["failure_reason"]
    assert [row["charge"] for row in ledgerpay.ledger()["refunds"]].count(charge["id"]) == 1


async def test_a_declined_card_is_refused_once_and_charges_nothing(
    stack: Stack, ledgerpay: Ledgerpay
) -> None:
    answer, _ = await call_until_answered(
        stack,
        "ledgerpay_charge",
        a_charge("o-declined", payment_method="pm_card_declined"),
        key=f"pay-{uuid.uuid4().hex}",
    )

    assert answer.state == "failed"
    [step] = (await task_status(stack, answer.task_id))["steps"]
    reference = step["evidence"]["charge_key_digest"]
    assert [a["outcome"] for a in step["attempts"]] == ["rejected"]
    assert "card_declined" in step["failure_reason"]
    assert ledgerpay.charges(reference) == []
    assert [row["answer"] for row in ledgerpay.requests(reference)] == [402]


# ── past the key window ─────────────────────────────────────────────────────────────


async def first_call_while_held(stack: Stack, arguments: dict[str, Any], key: str) -> TaskResult:
    """The agent's first call, answered 202 while ledgerpay holds the charge."""
    async with stack.agent() as agent:
        answer = await agent.call_tool(
            "ledgerpay_charge", arguments, idempotency_key=key, retries=0
        )
    assert answer.state == "running", answer.body
    return answer


async def past_the_window(
    ledgerpay: Ledgerpay, dev_server: WorkflowEnvironment, task_id: str
) -> None:
    """Wait until ledgerpay holds the step's request and the step's key window has
    closed; then move ledgerpay's clock on so that it, too, forgot the key."""
    await eventually(ledgerpay.faults, until=lambda f: f["held"] == 1, what="the charge is held")
    await key_window_closed(dev_server.client, task_id)
    ledgerpay.advance_clock(2 * 3600)


async def test_past_the_key_window_a_lost_answer_is_looked_up_and_not_sent_again(
    short_stack: Stack, ledgerpay: Ledgerpay, dev_server: WorkflowEnvironment
) -> None:
    key = f"pay-{uuid.uuid4().hex}"
    ledgerpay.arm(hold_requests=1)
    running = await first_call_while_held(short_stack, a_charge("o-late"), key)
    await past_the_window(ledgerpay, dev_server, running.task_id)
    # Then the charge commits and its answer is lost.
    ledgerpay.arm(drop_responses=1)
    ledgerpay.release()

    answer, _ = await call_until_answered(
        short_stack, "ledgerpay_charge", a_charge("o-late"), key=key
    )

    assert answer.state == "succeeded"
    status = await task_status(short_stack, answer.task_id)
    [step] = status["steps"]
    reference = step["evidence"]["charge_key_digest"]
    assert status["policies"]["ledgerpay_charge"]["key_retention"] == "PT3S"
    assert [a["outcome"] for a in step["attempts"]] == ["unknown"]
    assert "send window of the step's key closed" in step["evidence"]["looked_up_because"]
    assert step["result"]["found_by"] == "lookup"
    # ledgerpay had forgotten the key: only because nothing was sent again is it one charge.
    assert [row["id"] for row in ledgerpay.charges(reference)] == [step["resource_id"]]
    assert len(ledgerpay.requests(reference)) == 1


async def test_past_the_key_window_a_failed_charge_parks_and_an_operator_settles_it_once(
    short_stack: Stack, ledgerpay: Ledgerpay, dev_server: WorkflowEnvironment
) -> None:
    key = f"pay-{uuid.uuid4().hex}"
    arguments = a_charge("o-parked")
    ledgerpay.arm(hold_requests=1)
    running = await first_call_while_held(short_stack, arguments, key)
    task_id = running.task_id
    await past_the_window(ledgerpay, dev_server, task_id)
    # Then the charge fails without committing: nothing exists, and the key is too old to
    # send again, so onceflow looks it up (a consistent miss) and parks.
    ledgerpay.arm(fail_without_commit=1)
    ledgerpay.release()

    parked, _ = await call_until_answered(short_stack, "ledgerpay_charge", arguments, key=key)

    assert parked.state == "parked"
    await workflow_idle(dev_server.client, task_id)  # nothing more goes out by itself
    [step] = (await task_status(short_stack, task_id))["steps"]
    first_reference = step["evidence"]["charge_key_digest"]
    assert "there is none" in step["evidence"]["reference_read"]
    assert ledgerpay.charges(first_reference) == []
    assert [row["answer"] for row in ledgerpay.requests(first_reference)] == [500]

    # An operator naming someone else's charge is refused: the look-up reads it back.
    async with httpx.AsyncClient(base_url=ledgerpay.url) as http:
        by_hand = await http.post(
            "/charges",
            json={**arguments, "description": "by hand", "reference": "by-hand"},
        )
    others = by_hand.json()["id"]
    refused = short_stack.reconcile(
        task_id, "--step", step["step_id"], "--decision", "happened", "--resource-id", others,
        "--reason", "found it, I think",
    )  # fmt: skip
    assert refused.returncode != 0, refused.stdout
    assert "another reference" in refused.stdout + refused.stderr
    # did_not_happen needs no --unverified: ledgerpay's consistent miss proves it.
    accepted = short_stack.reconcile(
        task_id, "--step", step["step_id"], "--decision", "did_not_happen",
        "--reason", "no charge under the step's reference",
    )  # fmt: skip
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr

    answer, _ = await call_until_answered(short_stack, "ledgerpay_charge", arguments, key=key)

    assert answer.state == "succeeded"
    [step] = (await task_status(short_stack, task_id))["steps"]
    assert step["key_generation"] == 2
    assert [a["outcome"] for a in step["attempts"]] == ["unknown", "succeeded"]
    assert step["attempts"][-1]["operator_authorised"]
    new_reference = step["result"]["reference"]
    assert new_reference != first_reference
    assert [row["id"] for row in ledgerpay.charges(new_reference)] == [step["resource_id"]]
    assert ledgerpay.charges(first_reference) == []
    assert len(ledgerpay.requests(new_reference)) == 1
