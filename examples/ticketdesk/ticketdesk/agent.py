"""A minimal agent runtime that opens one ticket per incident and retries as real agents do.

It "plans" one tool call per incident of a fixed list and gives each logical call one
idempotency key, ``<plan id>.<step>``, that every retry of that call reuses. It calls
again, with the same key and a short backoff, when an answer times out, the connection
fails, a response is lost, or the task is still running (202). It stops at an answer that
needs a person (``parked``, ``awaiting_approval``) or a refusal. It reaches onceflow
through the Python client (the gateway's HTTP API) or through MCP (streamable HTTP).

``--lose-responses N`` throws away the first N answers it receives, as a flaky network
between agent and gateway would. One line per attempt, then a summary::

    python -m ticketdesk.agent --gateway http://127.0.0.1:8080 --api-key ofk_... \\
        [--via client|mcp] [--mcp-url URL] [--lose-responses N] [--tool create_ticket]
"""

import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from onceflow_client import OnceflowClient, OnceflowError, RequestInProgress


@dataclass(frozen=True)
class Incident:
    """Something the agent was asked to open a ticket for."""

    slug: str
    title: str
    description: str


INCIDENTS = (
    Incident(
        "checkout-latency",
        "Checkout p99 latency above 2 s since 09:40",
        "Alert checkout-p99 fired for 15 minutes; the payments dashboard shows retries.",
    ),
    Incident(
        "db-disk",
        "Primary database disk at 91 %",
        "The orders database grows 2 % an hour; vacuum has not run since Monday.",
    ),
    Incident(
        "tls-expiry",
        "TLS certificate of api.example.com expires in 5 days",
        "Auto-renewal failed twice: the DNS challenge record is missing.",
    ),
)
WAITING_FOR_A_PERSON = frozenset({"parked", "awaiting_approval"})
STILL_RUNNING = "running"


@dataclass(frozen=True)
class Answer:
    """What one attempt got back, whichever way it went."""

    code: str
    """How it came back: ``HTTP 200``, ``HTTP 202``, ``HTTP 409``; ``MCP``, ``MCP 422``."""
    state: str
    """The task's state, ``busy`` (another request holds the key: ask again) or ``refused``."""
    task_id: str | None = None
    ticket_id: str | None = None
    onceflow_attempts: int = 0
    """Attempts onceflow made inside the task (its own retries, invisible to the agent)."""
    replayed: bool = False
    detail: str = ""


class Channel(Protocol):
    """How the agent reaches onceflow."""

    label: str

    async def call(self, tool: str, arguments: dict[str, Any], key: str) -> Answer:
        """One attempt; raises on a timeout or a failed connection."""
        ...


class ClientChannel:
    """The gateway's HTTP API through ``onceflow_client``."""

    def __init__(self, client: OnceflowClient, gateway: str) -> None:
        self.client = client
        self.label = f"the Python client ({gateway})"

    async def call(self, tool: str, arguments: dict[str, Any], key: str) -> Answer:
        try:
            # retries=0: this agent owns its retries, so it can show (and lose) each answer.
            task = await self.client.call_tool(tool, arguments, idempotency_key=key, retries=0)
        except RequestInProgress as busy:
            return Answer(code="HTTP 409", state="busy", detail=str(busy.problem_type))
        except OnceflowError as refused:
            return Answer(
                code=f"HTTP {refused.status}", state="refused", detail=str(refused.problem_type)
            )
        return _task_answer(f"HTTP {task.status_code}", task.body, replayed=task.replayed)


class McpChannel:
    """onceflow's MCP server over streamable HTTP, one session per attempt: a connection
    that broke mid-call never outlives its attempt."""

    def __init__(self, url: str, api_key: str, timeout: float) -> None:
        self.url, self.api_key, self.timeout = url, api_key, timeout
        self.label = f"MCP ({url})"

    async def call(self, tool: str, arguments: dict[str, Any], key: str) -> Answer:
        # Nested blocks, not an exit stack: the transport's task group must surround the
        # session, or a failed connection surfaces as a bare cancellation.
        async with (
            httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {self.api_key}"}, timeout=self.timeout
            ) as http,
            streamable_http_client(self.url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            result = await session.call_tool(
                tool, {**arguments, "idempotency_key": key}, read_timeout_seconds=self.timeout
            )
        body: dict[str, Any] = result.structured_content or {}
        replayed = bool((result.meta or {}).get("onceflow/replayed", False))
        if "task_id" not in body:  # a refusal: the problem document
            status = str(body.get("status", "error"))
            state = "busy" if status == "409" else "refused"
            kind = str(body.get("type", "")).rsplit(":", 1)[-1]
            return Answer(code=f"MCP {status}", state=state, detail=kind)
        return _task_answer("MCP", body, replayed=replayed)


@dataclass
class Run:
    """What happened during one run of the plan."""

    lose_responses: int
    attempts: int = 0
    outcomes: dict[str, str] = field(default_factory=dict)
    """Logical call (step) -> how it ended."""
    tickets: dict[str, str] = field(default_factory=dict)
    """Logical call (step) -> the ticket it produced."""
    tasks: dict[str, str] = field(default_factory=dict)
    """Logical call (step) -> the onceflow task that runs it."""


async def run_plan(
    channel: Channel,
    *,
    tool: str,
    plan_id: str,
    lose_responses: int,
    max_attempts: int,
    out: Any = sys.stdout,
) -> Run:
    """Make one logical call per incident, each with its own key, retrying on its own."""
    run = Run(lose_responses=lose_responses)
    print(
        f"plan {plan_id}: {len(INCIDENTS)} logical calls of {tool} via {channel.label}",
        file=out,
        flush=True,
    )
    for step, incident in enumerate(INCIDENTS, start=1):
        key = f"{plan_id}.{step}"  # one key per logical call, reused by each of its retries
        # The run is part of the ticket: onceflow answers an identical ticket asked again
        # within a day (another run, key or agent) with the first one (its intent rule).
        arguments = {
            "title": incident.title,
            "description": f"{incident.description} (triage {plan_id})",
        }
        run.outcomes[key] = await _call_until_answered(
            channel, run, tool, arguments, key, incident, max_attempts, out
        )
    tickets = sorted(set(run.tickets.values()))
    ended = ", ".join(
        f"{sum(1 for o in run.outcomes.values() if o == outcome)} {outcome}"
        for outcome in sorted(set(run.outcomes.values()))
    )
    print(
        f"summary: {len(run.outcomes)} logical calls, {run.attempts} attempts, "
        f"{len(tickets)} tickets reported ({', '.join(tickets) or 'none'}); {ended}",
        file=out,
        flush=True,
    )
    return run


async def _call_until_answered(
    channel: Channel,
    run: Run,
    tool: str,
    arguments: dict[str, Any],
    key: str,
    incident: Incident,
    max_attempts: int,
    out: Any,
) -> str:
    for attempt in range(1, max_attempts + 1):
        run.attempts += 1
        prefix = f"  {incident.slug:<16} attempt {attempt}  key {key}  "
        try:
            answer = await channel.call(tool, arguments, key)
        except Exception as error:  # a timeout, a reset, a broken session: it may have run
            print(f"{prefix}no answer ({_error_name(error)}) -> retry", file=out, flush=True)
            await _back_off(attempt)
            continue
        line = f"{prefix}{answer.code} {answer.state}"
        if answer.ticket_id:
            line += f" {answer.ticket_id}"
        notes = ["replayed"] if answer.replayed else []
        if answer.onceflow_attempts > 1:
            notes.append(f"onceflow made {answer.onceflow_attempts} attempts")
        if notes:
            line += f" ({'; '.join(notes)})"
        if run.lose_responses > 0:
            run.lose_responses -= 1
            print(f"{line} -> answer lost on the way, retry", file=out, flush=True)
            await _back_off(attempt)
            continue
        if answer.task_id:
            run.tasks[key] = answer.task_id
        if answer.state == "succeeded":
            print(line, file=out, flush=True)
            if answer.ticket_id:
                run.tickets[key] = answer.ticket_id
            return "succeeded"
        if answer.state in (STILL_RUNNING, "busy"):
            print(f"{line} -> ask again with the same key", file=out, flush=True)
            await _back_off(attempt)
            continue
        if answer.state in WAITING_FOR_A_PERSON:
            print(
                f"{line} -> a person decides{_said(answer)}\n      task {answer.task_id}",
                file=out,
                flush=True,
            )
            return answer.state
        print(f"{line} -> giving up{_said(answer)}", file=out, flush=True)
        return answer.state
    print(f"  {incident.slug:<16} no final answer after {max_attempts} attempts", file=out)
    return "unanswered"


def _task_answer(code: str, body: dict[str, Any], *, replayed: bool) -> Answer:
    # A call of an open task (an MCP session's) answers with the call itself; a one-step
    # task with the task, whose last step is the call.
    steps: list[dict[str, Any]] = body.get("steps") or [{}]
    step = body if "step_id" in body else steps[-1]
    return Answer(
        code=code,
        state=str(body.get("state", "")),
        task_id=body.get("task_id"),
        ticket_id=step.get("resource_id"),
        onceflow_attempts=int(step.get("attempts", 0)),
        replayed=replayed,
        detail=str(step.get("park_reason") or step.get("failure_reason") or ""),
    )


def _error_name(error: BaseException) -> str:
    # The MCP transport reports a failed connection as a group from its task group.
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return type(error).__name__


def _said(answer: Answer) -> str:
    return f": {answer.detail}" if answer.detail else ""


async def _back_off(attempt: int) -> None:
    await asyncio.sleep(min(0.25 * 2 ** (attempt - 1), 4.0))


@asynccontextmanager
async def open_channel(args: argparse.Namespace) -> AsyncIterator[Channel]:
    """The channel ``--via`` names, closed at the end."""
    if args.via == "client":
        async with OnceflowClient(args.gateway, api_key=args.api_key, timeout=args.timeout) as c:
            yield ClientChannel(c, args.gateway)
        return
    yield McpChannel(args.mcp_url, args.api_key, args.timeout)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the plan; exit 0 when every logical call succeeded, else 1."""
    parser = argparse.ArgumentParser(
        prog="python -m ticketdesk.agent",
        description="Open one help-desk ticket per incident through onceflow, retrying "
        "with one idempotency key per logical call.",
    )
    parser.add_argument("--gateway", default="http://127.0.0.1:8080", help="gateway URL")
    parser.add_argument("--api-key", required=True, help="the principal's API key")
    parser.add_argument("--via", choices=("client", "mcp"), default="client")
    parser.add_argument(
        "--mcp-url", default="http://127.0.0.1:8090/mcp", help="MCP endpoint for --via mcp"
    )
    parser.add_argument(
        "--tool", choices=("create_ticket", "create_ticket_unkeyed"), default="create_ticket"
    )
    parser.add_argument(
        "--lose-responses", type=int, default=0, help="throw away the first N answers"
    )
    parser.add_argument(
        "--plan-id",
        default=None,
        help="names the plan's keys; the same plan id replays its answers (default: new)",
    )
    parser.add_argument("--max-attempts", type=int, default=6, help="per logical call")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per attempt")
    parser.add_argument("--json", action="store_true", help="also print the run as JSON")
    args = parser.parse_args(argv)
    plan_id = args.plan_id or f"triage-{uuid.uuid4().hex[:8]}"

    async def body() -> Run:
        async with open_channel(args) as channel:
            return await run_plan(
                channel,
                tool=args.tool,
                plan_id=plan_id,
                lose_responses=args.lose_responses,
                max_attempts=args.max_attempts,
            )

    run = asyncio.run(body())
    if args.json:
        print(
            json.dumps(
                {
                    "plan_id": plan_id,
                    "logical_calls": len(run.outcomes),
                    "attempts": run.attempts,
                    "outcomes": run.outcomes,
                    "tickets": run.tickets,
                    "tasks": run.tasks,
                }
            ),
            flush=True,
        )
    return 0 if all(outcome == "succeeded" for outcome in run.outcomes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
