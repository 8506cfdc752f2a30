"""The ticketdesk example end to end: a tool installed from outside, registered by config.

The example package is installed (offline, into a private folder) like any third-party
package; the worker, gateway and MCP server processes find its tools through the
``onceflow.tools`` entry point because ``ONCEFLOW_TOOLS=ticketdesk``, and nothing in this
process registers them. The example's own agent retries through the Python client and
through MCP while answers are lost on both sides; the help desk's ledger must hold one
ticket per logical call.
"""

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from tests.harness import HANG_SECONDS, REPO, onceflow_command, replay_tools_from

from .installation import install_example, start, stop_all, wait_for

EXAMPLE = REPO / "examples" / "ticketdesk"
TOOLS = "create_ticket,create_ticket_unkeyed"


@dataclass(frozen=True)
class Desk:
    """The running example: help-desk service, onceflow processes and an agent's key."""

    service_url: str
    gateway_url: str
    mcp_url: str
    api_key: str
    env: dict[str, str]
    logs: Path

    def ledger(self, **metadata: str) -> list[dict[str, Any]]:
        """Every ticket the service ever created (optionally those with this metadata)."""
        response = httpx.get(f"{self.service_url}/tickets", params=metadata, timeout=HANG_SECONDS)
        response.raise_for_status()
        tickets: list[dict[str, Any]] = response.json()["tickets"]
        return tickets

    def drop_next_responses(self, count: int) -> None:
        """The next ``count`` ticket creations commit, then lose their answer."""
        httpx.post(f"{self.service_url}/_faults", json={"drop_responses": count}).raise_for_status()

    def faults_left(self) -> int:
        """Dropped answers armed but not yet used."""
        return int(httpx.get(f"{self.service_url}/_faults").json()["drop_responses"])

    def status(self, task_id: str) -> dict[str, Any]:
        """The task's status as ``onceflow status --json`` prints it."""
        shown = subprocess.run(
            onceflow_command("status", task_id, "--json"),
            cwd=REPO,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        status: dict[str, Any] = json.loads(shown.stdout)
        return status

    def agent(self, *arguments: str) -> tuple[int, str, dict[str, Any]]:
        """Run the example agent; its exit code, its output and its JSON run report."""
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "ticketdesk.agent",
                "--gateway",
                self.gateway_url,
                "--mcp-url",
                self.mcp_url,
                "--api-key",
                self.api_key,
                "--json",
                *arguments,
            ],
            env={**os.environ, **self.env},
            # Outside the repository: the agent runs from the installed package.
            cwd=self.logs,
            capture_output=True,
            text=True,
            timeout=60,
        )
        output = done.stdout + done.stderr
        last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "{}"
        try:
            report = json.loads(last)
        except json.JSONDecodeError:
            raise AssertionError(f"the agent printed no report:\n{output}") from None
        return done.returncode, output, report


@pytest.fixture(scope="module")
def desk(
    postgres_url: str, dev_server: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Desk]:
    """The example's service, and a worker, a gateway and an MCP server told by
    configuration alone to load the installed example's tools."""
    root = tmp_path_factory.mktemp("ticketdesk")
    logs = root / "logs"
    logs.mkdir()
    site = install_example(EXAMPLE, root)
    replay_tools_from(site, "ticketdesk")  # its tasks replay at the end of the run
    python_path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    processes: list[subprocess.Popen[bytes]] = []
    try:
        service = start(
            [sys.executable, "-m", "ticketdesk.service", "--port", "0"],
            {"PYTHONPATH": python_path},
            logs / "service.log",
        )
        processes.append(service)
        service_url = wait_for(service, logs / "service.log", r"ready on (\S+)").group(1)
        env = {
            "PYTHONPATH": python_path,
            "PYTHONUNBUFFERED": "1",
            "DATABASE_URL": postgres_url,
            "TEMPORAL_ADDRESS": dev_server.client.service_client.config.target_host,
            "ONCEFLOW_TASK_QUEUE": f"ticketdesk-{uuid.uuid4().hex[:8]}",
            # Never join services a developer's own `onceflow dev` left recorded.
            "ONCEFLOW_STATE_DIR": str(root / "state"),
            "ONCEFLOW_SHUTDOWN_GRACE_SECONDS": "2",
            # A parked task answers 202 after this wait; keep the test short.
            "ONCEFLOW_GATEWAY_REPLAY_WAIT_SECONDS": "5",
            "ONCEFLOW_TOOLS": "ticketdesk",
            # No Stripe key or deployment target here: serve the local built-in tools only.
            "ONCEFLOW_BUILTIN_TOOLS": "issue_coupon,create_order,send_email",
            "TICKETDESK_URL": service_url,
        }
        worker = start(onceflow_command("worker"), env, logs / "worker.log")
        gateway = start(onceflow_command("gateway", "--port", "0"), env, logs / "gateway.log")
        mcp = start(
            onceflow_command("mcp", "--transport", "http", "--port", "0"), env, logs / "mcp.log"
        )
        processes += [worker, gateway, mcp]
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
            ),
            cwd=REPO,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert added.returncode == 0, added.stderr
        wait_for(worker, logs / "worker.log", "onceflow worker ready")
        gateway_url = wait_for(gateway, logs / "gateway.log", r"gateway ready on (\S+)").group(1)
        mcp_url = wait_for(mcp, logs / "mcp.log", r"MCP server ready on (\S+)").group(1)
        yield Desk(
            service_url=service_url,
            gateway_url=gateway_url,
            mcp_url=mcp_url,
            api_key=added.stdout.strip().splitlines()[-1],
            env={"PYTHONPATH": python_path, "TEMPORAL_ADDRESS": env["TEMPORAL_ADDRESS"]},
            logs=logs,
        )
    finally:
        stop_all(processes)


def test_service_dedupes_keyed_requests_and_not_legacy_ones(desk: Desk) -> None:
    body = {"title": "rules", "metadata": {"operation": "sha256:rules"}}
    with httpx.Client(base_url=desk.service_url) as http:
        first = http.post("/tickets", json=body, headers={"Idempotency-Key": "k-rules"})
        again = http.post("/tickets", json=body, headers={"Idempotency-Key": "k-rules"})
        other = http.post(
            "/tickets", json={**body, "title": "other"}, headers={"Idempotency-Key": "k-rules"}
        )
        http.post("/legacy/tickets", json=body, headers={"Idempotency-Key": "k-rules"})

    assert first.status_code == 201 and again.status_code == 201
    assert again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Original-Request"] == first.headers["Request-Id"]
    assert other.status_code == 422
    assert len(desk.ledger(operation="sha256:rules")) == 2  # one keyed, one legacy


def test_the_gateway_documents_the_configured_tools_with_their_contracts(desk: Desk) -> None:
    document = httpx.get(f"{desk.gateway_url}/openapi.json", timeout=HANG_SECONDS).json()
    assert "/v1/tools/create_ticket/calls" in document["paths"]
    assert "CreateTicketInput" in document["components"]["schemas"]
    tools = httpx.get(
        f"{desk.gateway_url}/v1/tools",
        headers={"Authorization": f"Bearer {desk.api_key}"},
        timeout=HANG_SECONDS,
    ).json()
    by_name = {tool["name"]: tool for tool in tools}
    assert by_name["create_ticket"]["dedupe"] == "provider_idempotency_key"
    assert by_name["create_ticket"]["annotations"]["idempotentHint"] is True
    assert by_name["create_ticket_unkeyed"]["dedupe"] == "none"
    assert by_name["create_ticket_unkeyed"]["annotations"]["idempotentHint"] is False


@pytest.mark.parametrize("via", ["client", "mcp"])
def test_agent_retries_make_one_ticket_per_logical_call(desk: Desk, via: str) -> None:
    before = {ticket["id"] for ticket in desk.ledger()}
    # The help desk commits the first ticket and loses its answer (onceflow repeats the
    # attempt with the same child key); the agent loses two of onceflow's answers
    # (it repeats the call with the same idempotency key).
    desk.drop_next_responses(1)

    code, output, run = desk.agent("--via", via, "--lose-responses", "2")

    assert code == 0, output
    new = [ticket for ticket in desk.ledger() if ticket["id"] not in before]
    assert run["logical_calls"] == 3
    assert run["attempts"] >= 5, output  # every call once, plus two lost answers
    assert set(run["outcomes"].values()) == {"succeeded"}, output
    assert len(new) == 3, output
    assert sorted(run["tickets"].values()) == sorted(ticket["id"] for ticket in new)
    assert len({ticket["metadata"]["operation"] for ticket in new}) == 3
    assert desk.faults_left() == 0  # the dropped answer did happen
    assert "onceflow made 2 attempts" in output  # the dropped answer, repeated inside


def test_unkeyed_tool_parks_after_a_lost_answer_instead_of_creating_twice(desk: Desk) -> None:
    before = {ticket["id"] for ticket in desk.ledger()}
    desk.drop_next_responses(1)

    code, output, run = desk.agent("--tool", "create_ticket_unkeyed")

    first_call = next(iter(run["outcomes"]))
    assert code == 1, output
    assert run["outcomes"][first_call] == "parked", output
    status = desk.status(run["tasks"][first_call])
    assert status["state"] == "parked"
    [step] = status["steps"]
    assert step["state"] == "parked" and len(step["attempts"]) == 1
    assert step["attempts"][0]["outcome"] == "unknown"
    new = [ticket for ticket in desk.ledger() if ticket["id"] not in before]
    assert len(new) == 3, output  # the parked call's ticket exists once, the others once each
    assert len(desk.ledger(operation=step["evidence"]["create_key_digest"])) == 1


def test_a_step_whose_answers_stay_lost_is_found_by_its_lookup_instead_of_parking(
    desk: Desk,
) -> None:
    before = {ticket["id"] for ticket in desk.ledger()}
    # Every answer of the first call's five attempts is lost (the first creates the ticket,
    # the four repeats replay it): the step's budget runs out with the outcome unknown,
    # and the lookup finds the ticket by its operation digest before the step would park.
    desk.drop_next_responses(5)

    code, output, run = desk.agent("--max-attempts", "12")

    assert code == 0, output
    first_call = next(iter(run["outcomes"]))
    status = desk.status(run["tasks"][first_call])
    [step] = status["steps"]
    assert step["state"] == "succeeded"
    assert [attempt["outcome"] for attempt in step["attempts"]] == ["unknown"] * 5
    assert step["evidence"]["found_by"] == "lookup"
    new = [ticket for ticket in desk.ledger() if ticket["id"] not in before]
    assert len(new) == 3, output
    assert step["resource_id"] == run["tickets"][first_call]
    assert desk.faults_left() == 0
