"""The checker's reading of the provider's request log and the payment key windows.

Violations: a POST under an idempotency key ``KEY_RETENTION_SECONDS`` or more after the
key's first request (an expired key sent again), and a request under a payment step's
older key generation after its newer one was first sent (a retired key sent again).
Figures: the key window at work in each payment step (new key generations, attempts
refused past the send-by deadline or timed out across the SIGSTOP), and keys first sent
after the workflow's send-by deadline.
"""

import math
from collections import defaultdict
from datetime import datetime
from typing import Any

from .config import KEY_RETENTION_MARGIN_SECONDS, KEY_RETENTION_SECONDS
from .context import RunContext


class KeyWindows:
    """What the request log and the tasks' attempts say about the payment key windows."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.first_attempts: dict[tuple[str, str, int], float] = {}
        """(task, step, key generation) → when its first attempt started (Unix time)."""

    def expired_key_sends(self, requests: list[dict[str, Any]]) -> list[str]:
        """Violations from the provider's request log: a POST under an idempotency key
        that arrived ``KEY_RETENTION_SECONDS`` or more after the key's first request,
        when the provider may have forgotten the key (onceflow sends nothing under a key
        past its first send + retention - margin)."""
        first: dict[str, float] = {}
        latest = 0.0
        found = []
        for request in sorted(requests, key=lambda r: float(r["received_at"])):
            key = request.get("idempotency_key")
            if request["method"] != "POST" or not key:
                continue
            age = float(request["received_at"]) - first.setdefault(key, request["received_at"])
            latest = max(latest, age)
            if age >= KEY_RETENTION_SECONDS:
                found.append(
                    f"provider request {request['request_id']} ({request['path']}, "
                    f"{request['outcome']}) sent idempotency key {key[:16]}… {age:.1f} s "
                    f"after its first request; the provider keeps keys "
                    f"{KEY_RETENTION_SECONDS:g} s"
                )
        self.ctx.figures["provider keys sent (distinct)"] = len(first)
        self.ctx.durations["latest repeat of a provider key after its first send (s)"] = round(
            latest, 1
        )
        return found

    def retired_key_sends(
        self,
        requests: list[dict[str, Any]],
        generations: dict[str, tuple[str, str, str, int]],
    ) -> list[str]:
        """Violations from the provider's request log: a request under a key of an older
        generation that arrived after the step's newer generation was first sent.

        A step moves to a new key generation only after an operator's ``did_not_happen``
        once its old key could no longer be sent; from then on the old key must stay
        silent (a late send under it is a second live key: two effects for one step)."""
        sends: dict[tuple[str, str, str], dict[int, list[float]]] = defaultdict(
            lambda: defaultdict(list)
        )
        for request in requests:
            operation = generations.get(request.get("idempotency_key") or "")
            if request["method"] == "POST" and operation is not None:
                workflow_id, step_id, child_op, generation = operation
                sends[(workflow_id, step_id, child_op)][generation].append(
                    float(request["received_at"])
                )
        found = []
        for (workflow_id, step_id, child_op), by_generation in sends.items():
            for old, times in by_generation.items():
                for new, newer in by_generation.items():
                    if new > old and max(times) > min(newer):
                        found.append(
                            f"task {workflow_id} step {step_id} ({child_op}): key generation "
                            f"{old} sent {max(times) - min(newer):.1f} s after generation "
                            f"{new} was first sent"
                        )
        return found

    def count_late_first_sends(
        self,
        requests: list[dict[str, Any]],
        generations: dict[str, tuple[str, str, str, int]],
    ) -> None:
        """Count keys whose first request reached the provider after the send-by deadline
        the workflow reckons (first attempt of the generation + retention - margin): an
        attempt that waited in a queue, or one frozen with the SIGSTOPped worker. Not a
        violation by itself (nothing was sent before under the key); a second effect or
        a retired key's send would be."""
        window = KEY_RETENTION_SECONDS - KEY_RETENTION_MARGIN_SECONDS
        first_sent: dict[str, float] = {}
        for request in requests:
            key = request.get("idempotency_key") or ""
            if request["method"] == "POST" and key in generations:
                first_sent[key] = min(float(request["received_at"]), first_sent.get(key, math.inf))
        for key, sent in first_sent.items():
            workflow_id, step_id, _, generation = generations[key]
            started = self.first_attempts.get((workflow_id, step_id, generation))
            if started is not None and sent > started + window:
                self.ctx.figures[
                    "payment keys first sent after the workflow's send-by deadline"
                ] += 1
                self.ctx.say(
                    f"late first send: task {workflow_id} step {step_id} generation "
                    f"{generation}, {sent - started:.1f} s after its first attempt started"
                )

    def count_key_window(self, workflow_id: str, step: dict[str, Any]) -> None:
        """Figures of the key window at work in one step of a task's final status."""
        if step["tool"] not in ("charge_payment", "refund_payment"):
            return
        for attempt in step.get("attempts", []):
            started = datetime.fromisoformat(attempt["started_at"]).timestamp()
            generation = (workflow_id, step["step_id"], int(attempt.get("key_generation") or 1))
            self.first_attempts[generation] = min(
                started, self.first_attempts.get(generation, started)
            )
        if int(step.get("key_generation") or 1) > 1:
            self.ctx.figures["payment steps that moved to a new key generation"] += 1
        for attempt in step.get("attempts", []):
            reason = attempt.get("reason") or ""
            if "send-by deadline" in reason:
                self.ctx.figures["payment attempts refused: key's send-by deadline passed"] += 1
            began = datetime.fromisoformat(attempt["started_at"])
            ended = datetime.fromisoformat(attempt["finished_at"])
            if "Timeout" in reason and any(
                began < resumed and ended > stopped for stopped, resumed in self.ctx.pauses
            ):
                self.ctx.figures["payment attempts timed out across the SIGSTOP"] += 1
