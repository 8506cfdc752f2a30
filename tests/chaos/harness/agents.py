"""The chaos run's agents: task drivers that talk to the gateways over HTTP, like agents.

Each agent takes the next planned task, submits it under its key (a share through both
gateways at the same instant) and re-sends the same key and body on a timeout, a reset,
409, 429 or 5xx, and to poll, until the task ends; a waiting task is handed to the
operator. An open task's agent sends its calls one by one (each under its own key, some
first answers lost and asked for again, some final answers asked for again, some calls
repeated by the model under a new key), then closes the task and sees it end ``closed``.
"""

import asyncio
import time
from typing import Any

import httpx

from .config import OPEN_TASK
from .context import RunContext
from .operators import Operator
from .records import CallRecord, TaskRecord


class Agents:
    """``concurrency`` agents driving the planned tasks until each has ended."""

    def __init__(self, ctx: RunContext, operator: Operator) -> None:
        self.ctx = ctx
        self.stack = ctx.stack
        self.operator = operator

    async def drive(self) -> None:
        queue: asyncio.Queue[TaskRecord] = asyncio.Queue()
        for record in self.ctx.records:
            queue.put_nowait(record)

        async def agent() -> None:
            while not queue.empty():
                record = queue.get_nowait()
                try:
                    await self.run_task(record)
                except Exception as error:  # an agent must never die silently
                    self.ctx.violations.append(f"task {record.number}: driver error {error!r}")
                self.ctx.finished += 1
                self.ctx.note_progress()

        await asyncio.gather(*(agent() for _ in range(self.ctx.config.concurrency)))

    async def submit(self, record: TaskRecord, url: str | None = None) -> dict[str, Any] | None:
        """POST the task with its key until a gateway answers 200/202 (like an agent)."""
        pause = 0.2
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            gateway = url or self.ctx.gateway()
            try:
                response = await self.ctx.http.post(
                    f"{gateway}/v1/tasks",
                    json=record.body,
                    headers=self.ctx.headers(record.key),
                )
            except httpx.HTTPError:
                self.ctx.figures["client retries after a timeout or reset"] += 1
                await asyncio.sleep(pause)  # scenario: the agent backs off before retrying
                pause = min(pause * 2, 3)
                continue
            record.answers[response.status_code] += 1
            self.ctx.recovery.answered(response.status_code, gateway)
            if response.status_code in (200, 201, 202):
                body: dict[str, Any] = response.json()
                record.task_ids.add(body["task_id"])
                if response.headers.get("Idempotent-Replayed") == "true":
                    self.ctx.figures["replayed answers"] += 1
                return body
            if response.status_code in (409, 429) or response.status_code >= 500:
                self.ctx.figures[f"answers {response.status_code} (retried, same key)"] += 1
                retry_after = float(response.headers.get("Retry-After", pause))
                backoff = min(retry_after, 3) * self.ctx.rng.uniform(0.5, 1.0)
                await asyncio.sleep(backoff)  # scenario: the agent honours Retry-After
                pause = min(pause * 2, 3)
                continue
            record.refusal = f"{response.status_code} {response.text[:300]}"
            return None
        record.refusal = "no gateway accepted the task within 600 s"
        return None

    async def run_task(self, record: TaskRecord) -> None:
        self.ctx.submitted += 1
        self.ctx.note_progress()
        if self.ctx.rng.random() < self.ctx.config.duplicate_share:
            # The same request at the same moment through both gateways.
            self.ctx.figures["tasks sent to both gateways at once"] += 1
            answers = await asyncio.gather(
                *(self.submit(record, url) for url in self.stack.gateway_urls)
            )
            answer = answers[0] or answers[1]
        else:
            answer = await self.submit(record)
        if answer is None:
            return
        if not record.acknowledged:
            record.acknowledged = True
            self.ctx.acknowledged += 1
        if record.tool == OPEN_TASK:
            await self.run_open_task(record, answer["task_id"])
        else:
            await self.follow(record, answer)

    async def follow(self, record: TaskRecord, answer: dict[str, Any]) -> None:
        """Approve, reconcile and re-ask (same key) until the task ends."""
        while self.ctx.driving or time.monotonic() < self.ctx.settle_deadline:
            state = answer.get("state")
            if state in ("succeeded", "failed"):
                record.final_state = state
                self.ctx.recovery.settled(record.number)
                return
            if state in ("awaiting_approval", "parked"):
                status = await self.operator.status(answer["task_id"])
                if status is not None:
                    await self.operator.decide(record, status)
            else:
                await asyncio.sleep(0.5)  # scenario: the agent re-asks (same key) at its pace
            next_answer = await self.submit(record)
            if next_answer is None:
                return
            answer = next_answer

    # open tasks ──────────────────────────────────────────────────────────────────────

    async def run_open_task(self, record: TaskRecord, task_id: str) -> None:
        """The agent's loop: each call in turn until it ended (a person decides the
        waiting ones), then close the task and see it end."""
        for call in record.calls:
            if not self.ctx.settling():
                return
            await self.run_call(record, task_id, call)
        await self.close_open_task(record, task_id)

    async def run_call(self, record: TaskRecord, task_id: str, call: CallRecord) -> None:
        answer = await self.send_call(task_id, call)
        while answer is not None and not answer["ended"] and self.ctx.settling():
            if answer["state"] in ("parked", "awaiting_approval"):
                # Told nothing final, the model picks the same call again (new key).
                for twin in record.calls:
                    if twin.repeats is call and twin.first is None:
                        self.ctx.figures["open-task calls repeated while the first one waited"] += 1
                        await self.send_call(task_id, twin)
                status = await self.operator.status(task_id)
                if status is not None:
                    await self.operator.decide(record, status)
                # The agent waits for the person's decision with the call's own key.
                answer = await self.send_call(task_id, call, wait=True)
            else:
                await asyncio.sleep(0.5)  # scenario: the agent asks again at its pace
                answer = await self.send_call(task_id, call)
        if answer is None or not answer["ended"]:
            return
        call.final = answer
        if self.ctx.rng.random() < 0.3:
            # The final answer is lost on its way back: the same key gets it again.
            again = await self.send_call(task_id, call)
            fields = ("step_id", "state", "resource_id", "repeat_of")
            if again is None or any(again[name] != answer[name] for name in fields):
                self.ctx.violations.append(
                    f"open task {record.number} call {call.index} ({call.tool}): asked again "
                    f"with its key after it ended, answered "
                    f"{ {n: (again or {}).get(n) for n in fields} } instead of "
                    f"{ {n: answer.get(n) for n in fields} }"
                )
            else:
                self.ctx.figures["open-task final answers asked again: the same answer"] += 1

    async def send_call(
        self, task_id: str, call: CallRecord, *, wait: bool = False
    ) -> dict[str, Any] | None:
        """POST the call with its key until the task answers it (200/202) or refuses it,
        retrying like an agent (same key on a timeout, reset, 409 in progress, 429, 5xx)."""
        body: dict[str, Any] = {"tool": call.tool, "arguments": call.arguments}
        if call.call_id is not None:
            body["call_id"] = call.call_id
        pause = 0.2
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            lose = call.lose_first_answer and not call.answers
            gateway = self.ctx.gateway()
            try:
                response = await self.ctx.http.post(
                    f"{gateway}/v1/tasks/{task_id}/calls",
                    json=body,
                    headers=self.ctx.headers(call.key),
                    params={"wait": "ended"} if wait else None,
                    # scenario: an agent that stops waiting early loses the answer
                    timeout=self.ctx.rng.uniform(0.01, 0.3) if lose else httpx.USE_CLIENT_DEFAULT,
                )
            except httpx.HTTPError:
                if lose:
                    call.lose_first_answer = False
                    self.ctx.figures["open-task call answers lost (resent with the same key)"] += 1
                else:
                    self.ctx.figures["client retries after a timeout or reset"] += 1
                await asyncio.sleep(pause)  # scenario: the agent backs off before retrying
                pause = min(pause * 2, 3)
                continue
            call.answers[response.status_code] += 1
            self.ctx.recovery.answered(response.status_code, gateway)
            if response.status_code in (200, 202):
                answer: dict[str, Any] = response.json()
                if call.step_id is None:
                    call.step_id = answer["step_id"]
                    call.first = answer
                elif answer["step_id"] != call.step_id:
                    self.ctx.violations.append(
                        f"call key {call.key}: answered as step {answer['step_id']} after "
                        f"step {call.step_id}"
                    )
                return answer
            problem = ""
            if response.headers.get("content-type", "").startswith("application/problem+json"):
                problem = str(response.json().get("type", ""))
            if problem.endswith(":call-refused"):
                call.refusal = str(response.json().get("reason"))
                return None
            if response.status_code in (409, 429) or response.status_code >= 500:
                self.ctx.figures[f"answers {response.status_code} (retried, same key)"] += 1
                retry_after = float(response.headers.get("Retry-After", pause))
                backoff = min(retry_after, 3) * self.ctx.rng.uniform(0.5, 1.0)
                await asyncio.sleep(backoff)  # scenario: the agent honours Retry-After
                pause = min(pause * 2, 3)
                continue
            call.refusal = f"{response.status_code} {response.text[:300]}"
            return None
        call.refusal = "no gateway answered the call within 600 s"
        return None

    async def close_open_task(self, record: TaskRecord, task_id: str) -> None:
        """Close the task (idempotent by itself: no key), then see it end closed."""
        pause = 0.2
        while self.ctx.settling():
            try:
                response = await self.ctx.http.post(
                    f"{self.ctx.gateway()}/v1/tasks/{task_id}/close", headers=self.ctx.headers()
                )
            except httpx.HTTPError:
                response = None
            if response is not None and response.status_code == 200:
                break
            if response is not None and (
                response.status_code not in (409, 429) and response.status_code < 500
            ):
                self.ctx.violations.append(
                    f"open task {record.number}: close answered {response.status_code} "
                    f"{response.text[:300]}"
                )
                return
            await asyncio.sleep(pause)  # scenario: the agent retries its close
            pause = min(pause * 2, 3)
        while self.ctx.settling():
            status = await self.operator.status(task_id)
            if status is not None and status["state"] == "closed":
                record.final_state = "closed"
                self.ctx.recovery.settled(record.number)
                return
            if status is not None and status["state"] in ("parked", "awaiting_approval"):
                await self.operator.decide(record, status)
            await asyncio.sleep(0.5)  # scenario: the agent polls its closing task
