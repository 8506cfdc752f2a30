"""The checker's part for open tasks: each one's calls against its final status and the
far sides' records."""

from collections import Counter
from typing import Any

from .checker_key_windows import KeyWindows
from .context import RunContext
from .records import TaskRecord


class OpenTaskCheck:
    """Checks an open task's calls (see :meth:`check_open_task`)."""

    def __init__(self, ctx: RunContext, windows: KeyWindows) -> None:
        self.ctx = ctx
        self.windows = windows

    def check_open_task(
        self,
        record: TaskRecord,
        status: dict[str, Any] | None,
        label: str,
        far: tuple[
            dict[str, list[dict[str, Any]]],
            dict[str, list[dict[str, Any]]],
            Counter[str],
            Counter[str],
        ],
        call_records: dict[str, list[tuple[str | None, str]]],
        per_tool: dict[str, Counter[str]],
    ) -> tuple[list[str], list[str]]:
        """An open task's calls against its final status and the far sides' records.

        Each call (one key) is one step of the task, whatever its agent resent; a call
        that ended ends as its agent was told; the model's repeat under a new key is
        answered by the earlier call (``repeat_of``, no attempt of its own) unless that
        one ended with no effect; each call's identity (user, customer, order, the
        order's PaymentIntent) has at most one effect, exactly one when it succeeded and
        none when it failed; the task ended closed, or is parked on a parked call.
        """
        charges, refunds, coupons, orders = far
        violations: list[str] = []
        stuck: list[str] = []
        self.ctx.figures["open tasks"] += 1
        self.ctx.figures["open-task calls sent (keys)"] += len(record.calls)
        for call in record.calls:
            if call.refusal is not None:
                self.ctx.figures[f"open-task calls refused: {call.refusal[:48]}"] += 1
                if not call.refusal.startswith("the task"):
                    violations.append(f"{label}: call {call.index} refused: {call.refusal}")
        if status is None:
            if record.acknowledged:
                stuck.append(f"{label}: no status from its task")
            return violations, stuck
        state = status["state"]
        steps = {step["step_id"]: step for step in status["steps"]}
        if state == "closed":
            self.ctx.figures["open tasks closed"] += 1
        elif state == "parked" and any(s["state"] == "parked" for s in steps.values()):
            self.ctx.figures["open tasks parked at end (a call parked)"] += 1
        else:
            stuck.append(f"{label}: open task still {state} ({status['workflow_id']})")
        answered = [call for call in record.calls if call.step_id is not None]
        if len({call.step_id for call in answered}) != len(answered):
            violations.append(f"{label}: two call keys were answered as one step")
        unknown = set(steps) - {call.step_id for call in answered}
        if unknown:
            violations.append(f"{label}: the task lists calls no key was answered with {unknown}")
        for call in record.calls:
            if call.step_id is None:
                if call.refusal is None and record.final_state is None:
                    stuck.append(f"{label}: call {call.index} ({call.tool}) never answered")
                continue
            kept = call_records.get(call.key, [])
            if len(kept) != 1 or kept[0][0] not in (None, status["workflow_id"]):
                violations.append(f"{label}: call key {call.key} has records {kept}")
            step = steps.get(call.step_id)
            if step is None:
                violations.append(
                    f"{label}: call {call.index} answered as {call.step_id}, "
                    "which the task does not list"
                )
                continue
            self.windows.count_key_window(status["workflow_id"], step)
            final = call.final
            if final is not None and (
                step["state"] != final["state"] or step["resource_id"] != final["resource_id"]
            ):
                violations.append(
                    f"{label}: call {call.index} ({call.tool}) was answered "
                    f"{final['state']} {final['resource_id']} but ended {step['state']} "
                    f"{step['resource_id']}"
                )
            if step["state"] not in (
                "succeeded",
                "failed",
                "denied",
                "abandoned",
                "parked",
                "awaiting_approval",
            ):
                stuck.append(f"{label}: call {call.index} ({call.tool}) still {step['state']}")
            if call.repeats is not None:
                original = steps.get(call.repeats.step_id or "")
                if step.get("repeat_of"):
                    self.ctx.figures["open-task repeats answered by the repeat guard"] += 1
                    if step["repeat_of"] != call.repeats.step_id or step["attempts"]:
                        violations.append(
                            f"{label}: call {call.index} repeats {call.repeats.step_id} but is "
                            f"answered by {step['repeat_of']} with {len(step['attempts'])} "
                            "attempts of its own"
                        )
                elif original is None or original["state"] not in ("failed", "denied"):
                    violations.append(
                        f"{label}: call {call.index} repeats call {call.repeats.index} "
                        f"({original and original['state']}) under a new key and ran again"
                    )
                else:
                    self.ctx.figures["open-task repeats run again (the first one failed)"] += 1
            elif step.get("repeat_of"):
                violations.append(f"{label}: call {call.index} is a repeat of {step['repeat_of']}")
        n = record.number
        charged = [e["payment_intent"] for e in charges.get(f"ord-{n}-3", [])]
        effects = {
            "issue_coupon": [f"coupon u-{n}-1"] * coupons[f"u-{n}-1"],
            "create_order": [f"order c-{n}-2"] * orders[f"c-{n}-2"],
            "charge_payment": charged,
            "refund_payment": [e["object_id"] for pi in charged for e in refunds.get(pi, [])],
        }
        for tool, found in effects.items():
            counts = per_tool[f"open/{tool}"]
            counts["effects"] += len(found)
            ran = [
                steps[call.step_id]
                for call in record.calls
                if call.tool == tool
                and call.step_id in steps
                and not steps[call.step_id].get("repeat_of")
            ]
            for step in ran:
                counts["tasks"] += 1
                counts[
                    {
                        "succeeded": "succeeded",
                        "failed": "failed",
                        "denied": "failed",
                        "abandoned": "failed",
                        "parked": "parked at end",
                        "awaiting_approval": "parked at end",
                    }.get(step["state"], "stuck")
                ] += 1
                counts["were parked"] += any(
                    seen["step"] == step["step_id"] for seen in record.parked_seen
                )
                counts["reconciled"] += step["step_id"] in record.reconciled_steps
            succeeded = [step for step in ran if step["state"] == "succeeded"]
            parked = [step for step in ran if step["state"] == "parked"]
            if len(found) > 1 or len(succeeded) > 1:
                violations.append(
                    f"{label}: {tool} {len(found)} effects {found} for "
                    f"{len(succeeded)} succeeded calls of one identity"
                )
            elif succeeded and not found:
                violations.append(f"{label}: {tool} call succeeded without an effect")
            elif found and not succeeded and not parked:
                violations.append(
                    f"{label}: {tool} calls ended {[s['state'] for s in ran]} but effects {found}"
                )
            elif (
                succeeded
                and tool in ("charge_payment", "refund_payment")
                and succeeded[0]["resource_id"] != found[0]
            ):
                violations.append(
                    f"{label}: {tool} call names {succeeded[0]['resource_id']} but the "
                    f"provider's effect is {found[0]}"
                )
        return violations, stuck
