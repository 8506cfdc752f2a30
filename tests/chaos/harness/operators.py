"""The chaos run's operator: a principal allowed to decide, working through the HTTP API.

It reads a waiting task's status, approves its steps that await approval (denying the
deployments planned to be denied), and reconciles a parked step from the far side's own
record (provider ledger, SMTP sink): ``happened`` with the resource found there, else
``did_not_happen``, and ``abandon`` once a step has come back parked after
``ABANDON_AFTER`` ``did_not_happen`` with still nothing at the far side.
"""

import asyncio
from typing import Any

import httpx

from .config import ABANDON_AFTER
from .context import RunContext
from .records import TaskRecord


class Operator:
    """Decides what waits for a person: approvals and reconciliations."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.stack = ctx.stack

    async def status(self, task_id: str) -> dict[str, Any] | None:
        try:
            response = await self.ctx.http.get(
                f"{self.ctx.gateway()}/v1/tasks/{task_id}", headers=self.ctx.headers(operator=True)
            )
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            await asyncio.sleep(0.5)  # scenario: an operator's console backs off
            return None
        status: dict[str, Any] = response.json()
        return status

    async def decide(self, record: TaskRecord, status: dict[str, Any]) -> None:
        waiting = taken = 0
        for step in status["steps"]:
            if step.get("repeat_of"):
                continue  # a repeat mirrors its earlier call, which is the one decided
            waiting += step["state"] in ("awaiting_approval", "parked")
            if step["state"] == "awaiting_approval":
                approved = not record.deny
                body = {
                    "step_id": step["step_id"],
                    "approved": approved,
                    "reason": "chaos run operator",
                    "arguments_digest": step["arguments_digest"],
                }
                if await self.decision(status["workflow_id"], "approve", body):
                    taken += 1
                    record.approvals.append(approved)
                    self.ctx.figures["approvals" if approved else "denials"] += 1
            elif step["state"] == "parked":
                if not step.get("park_reason") or not step.get("evidence"):
                    self.ctx.violations.append(
                        f"task {record.number} ({record.tool}) parked without evidence: "
                        f"{step.get('park_reason')!r} {step.get('evidence')!r}"
                    )
                record.parked_seen.append(
                    {
                        "step": step["step_id"],
                        "reason": step.get("park_reason"),
                        "evidence": step.get("evidence"),
                    }
                )
                resource = await self.find_effect(status, step)
                decision = "happened" if resource else "did_not_happen"
                if not resource and record.did_not_happen[step["step_id"]] >= ABANDON_AFTER:
                    # The provider keeps answering this key with the error it stored
                    # (Stripe replays a stored 500 for the key's whole retention), so an
                    # authorised attempt can never succeed; no effect exists: give up.
                    decision = "abandon"
                body = {
                    "step_id": step["step_id"],
                    "decision": decision,
                    "reason": "chaos run: looked up at the far side",
                    **({"resource_id": resource} if resource else {}),
                }
                if await self.decision(status["workflow_id"], "reconcile", body):
                    taken += 1
                    record.reconciled.append(body["decision"])
                    record.reconciled_steps.add(step["step_id"])
                    if body["decision"] == "did_not_happen":
                        record.did_not_happen[step["step_id"]] += 1
                    self.ctx.figures[f"parked steps reconciled: {body['decision']}"] += 1
                    if "send-by deadline" in (step.get("park_reason") or ""):
                        self.ctx.figures["parked steps whose key's send-by deadline passed"] += 1
        if waiting:
            record.undecided_in_a_row = 0 if taken else record.undecided_in_a_row + 1

    async def decision(self, task_id: str, kind: str, body: dict[str, Any]) -> bool:
        try:
            response = await self.ctx.http.post(
                f"{self.ctx.gateway()}/v1/tasks/{task_id}/{kind}",
                json=body,
                headers=self.ctx.headers(operator=True),
            )
        except httpx.HTTPError:
            return False
        # A decision the step already had (asked again before its state moved on) is
        # answered with it, decides nothing new and is not counted again.
        return response.status_code == 200 and not response.json().get("replayed")

    async def find_effect(self, status: dict[str, Any], step: dict[str, Any]) -> str | None:
        """What an operator would look up: the effect of a parked step at the far side,
        by the order id its charge (the step itself, or the refund's ``charge_step``)
        carries."""
        charge = step
        if step["tool"] == "refund_payment":
            named = step["arguments"].get("charge_step")
            charge = next((s for s in status["steps"] if s["step_id"] == named), step)
        order_id = charge["arguments"].get("order_id")
        if step["tool"] == "charge_payment":
            for entry in await self.ledger():
                if entry["kind"] == "charge" and entry["metadata"].get("order_id") == order_id:
                    return str(entry["payment_intent"])
            return None
        if step["tool"] == "refund_payment":
            ledger = await self.ledger()
            intents = {
                e["payment_intent"]
                for e in ledger
                if e["kind"] == "charge" and e["metadata"].get("order_id") == order_id
            }
            for entry in ledger:
                if entry["kind"] == "refund" and entry["payment_intent"] in intents:
                    return str(entry["object_id"])
            return None
        if step["tool"] == "send_email":
            message_id = step["evidence"].get("message_id")
            received = (
                await self.ctx.http.get(f"{self.stack.far['smtp_control_url']}/messages")
            ).json()
            return message_id if message_id in received["applied"] else None
        return None

    async def ledger(self) -> list[dict[str, Any]]:
        response = await self.ctx.http.get(f"{self.stack.far['provider_url']}/_test/ledger")
        entries: list[dict[str, Any]] = response.json()["data"]
        return entries
