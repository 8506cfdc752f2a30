"""A local deployment target (aiohttp) that fences every write by its token.

Far-side test infrastructure for ``start_deployment``, never imported by product code.
It speaks the contract of ``deployments._target``: ``POST
/deployments/{id}/steps/{step}`` with a ``fencing_token``. It remembers the highest
token it has seen per deployment and, when a write takes effect (after the step's
simulated work), refuses it with 409 ``stale_fencing_token`` if a newer token has been
seen meanwhile. Every write is kept, applied or refused, so tests assert what the far
side did::

    async with running_deploy_target(step_seconds=0.1) as target:
        hold = target.state.hold_next("roll_out")  # that write waits for hold.release()
        ...
        assert [w.fencing_token for w in target.state.refused(deployment_id)] == [1]

``GET /deployments`` and ``GET /deployments/{id}`` show the same record as JSON.
"""

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web

STEPS = frozenset({"prepare", "roll_out", "verify", "activate"})
"""The step names the target knows."""
_HOLD_LIMIT = 120.0
"""A held write is released after this many seconds even if nobody releases it."""


@dataclass(frozen=True)
class TargetWrite:
    """One write the target received, and what it did with it."""

    deployment_id: str
    step: str
    fencing_token: int
    owner: str
    service: str
    version: str
    environment: str
    applied: bool
    highest_token: int
    """The highest token the target had seen when the write took effect (or not)."""
    received_at: float
    decided_at: float


@dataclass
class Hold:
    """Holds the next write to one step until released (a slow network, a queue)."""

    step: str
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    released: asyncio.Event = field(default_factory=asyncio.Event)
    owner: str | None = None
    """The owner named by the held write, once it arrived."""
    fencing_token: int | None = None

    def release(self) -> None:
        """Let the held write take effect (or be refused)."""
        self.released.set()


@dataclass
class DeployTargetState:
    """The target's memory: highest tokens, every write, and pending holds."""

    step_seconds: float = 0.0
    """Simulated work per step, before the write takes effect."""
    highest: dict[str, int] = field(default_factory=dict)
    writes: list[TargetWrite] = field(default_factory=list)
    holds: list[Hold] = field(default_factory=list)

    def hold_next(self, step: str) -> Hold:
        """Hold the next write to ``step`` (any deployment) until ``release()``."""
        hold = Hold(step)
        self.holds.append(hold)
        return hold

    def applied(self, deployment_id: str) -> list[TargetWrite]:
        """The writes that took effect, in order."""
        return [w for w in self.writes if w.deployment_id == deployment_id and w.applied]

    def refused(self, deployment_id: str) -> list[TargetWrite]:
        """The writes refused for a stale token, in order."""
        return [w for w in self.writes if w.deployment_id == deployment_id and not w.applied]

    def snapshot(self, deployment_id: str | None = None) -> dict[str, Any]:
        """The record as JSON-ready data, for one deployment or all."""
        ids = [deployment_id] if deployment_id else sorted(self.highest)
        return {
            "deployments": [
                {
                    "deployment_id": one,
                    "highest_token": self.highest.get(one, 0),
                    "writes": [asdict(w) for w in self.writes if w.deployment_id == one],
                }
                for one in ids
            ]
        }

    def _take_hold(self, step: str) -> Hold | None:
        for hold in self.holds:
            if hold.step == step and not hold.arrived.is_set():
                return hold
        return None


def build_target_app(state: DeployTargetState) -> web.Application:
    """The target's aiohttp application over ``state``."""

    async def apply_step(request: web.Request) -> web.Response:
        deployment_id = request.match_info["deployment_id"]
        step = request.match_info["step"]
        try:
            body = await request.json()
            token = body["fencing_token"]
            details = {
                name: str(body[name]) for name in ("owner", "service", "version", "environment")
            }
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": "invalid_request"}, status=400)
        if not isinstance(token, int) or token < 1:
            return web.json_response({"error": "invalid_fencing_token"}, status=400)
        if step not in STEPS:
            return web.json_response({"error": "unknown_step"}, status=400)
        received_at = time.time()
        state.highest[deployment_id] = max(state.highest.get(deployment_id, 0), token)
        hold = state._take_hold(step)
        if hold is not None:
            hold.owner, hold.fencing_token = details["owner"], token
            hold.arrived.set()
            try:
                await asyncio.wait_for(hold.released.wait(), timeout=_HOLD_LIMIT)
            except TimeoutError:
                pass
        if state.step_seconds:
            await asyncio.sleep(state.step_seconds)
        # The fence: checked when the write takes effect, with no await in between.
        highest = state.highest[deployment_id]
        applied = token >= highest
        state.writes.append(
            TargetWrite(
                deployment_id=deployment_id,
                step=step,
                fencing_token=token,
                applied=applied,
                highest_token=highest,
                received_at=received_at,
                decided_at=time.time(),
                **details,
            )
        )
        if not applied:
            return web.json_response(
                {"error": "stale_fencing_token", "highest_token": highest}, status=409
            )
        return web.json_response({"step": step, "fencing_token": token})

    async def one(request: web.Request) -> web.Response:
        return web.json_response(state.snapshot(request.match_info["deployment_id"]))

    async def every(request: web.Request) -> web.Response:
        return web.json_response(state.snapshot())

    app = web.Application()
    app.router.add_post("/deployments/{deployment_id}/steps/{step}", apply_step)
    app.router.add_get("/deployments/{deployment_id}", one)
    app.router.add_get("/deployments", every)
    return app


@dataclass(frozen=True)
class RunningTarget:
    """A target serving HTTP."""

    url: str
    """``http://host:port``, to use as ``DEPLOY_TARGET_URL``."""
    state: DeployTargetState


@asynccontextmanager
async def running_deploy_target(
    state: DeployTargetState | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    step_seconds: float = 0.0,
) -> AsyncIterator[RunningTarget]:
    """Serve a target in the current event loop for the duration of the block.

    Args:
        state: State to serve; a fresh one by default.
        host: Interface to bind. Default ``"127.0.0.1"``.
        port: Port; 0 picks a free one. Default 0.
        step_seconds: Simulated work per step for a fresh state. Default 0.
    """
    target = state or DeployTargetState(step_seconds=step_seconds)
    runner = web.AppRunner(build_target_app(target), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound_host, bound_port = runner.addresses[0][:2]
        yield RunningTarget(f"http://{bound_host}:{bound_port}", target)
    finally:
        for hold in target.holds:
            hold.release()
        await runner.cleanup()
