"""The deployment target over HTTP: one fenced write per deployment step.

The wire contract a production target implements::

    POST {DEPLOY_TARGET_URL}/deployments/{deployment_id}/steps/{step}
    Fencing-Token: 7
    {"fencing_token": 7, "owner": "...", "service": "...", "version": "...",
     "environment": "..."}

    200 {"step": ..., "fencing_token": 7}     the step was applied under this token
    409 {"error": "stale_fencing_token", "highest_token": 8}
                                              a newer owner wrote first: never applied
    4xx                                       refused for good (unknown service, ...)
    5xx                                       the target failed; it may have applied it

The target remembers the highest token it has seen per deployment and refuses older
ones, so a paused or slow former owner can no longer change anything. The client never
retries (``retries=0``); failures come back as ``DeployTargetError`` with their class.
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

import httpx

from onceflow.deployments._settings import DeployTargetSettings
from onceflow.retry_policy import OutcomeClass
from onceflow.telemetry import outbound_call

STALE_TOKEN = "stale_fencing_token"
"""The error code a target answers with when a write carries an older token."""


@dataclass(frozen=True, kw_only=True)
class StepWrite:
    """One step of one deployment, written under a fencing token."""

    deployment_id: str
    step: str
    fencing_token: int
    owner: str
    service: str
    version: str
    environment: str


class DeployTargetError(Exception):
    """A step write failed; ``outcome`` says whether it may have been applied."""

    def __init__(self, outcome: OutcomeClass, reason: str, *, fenced_by: int | None = None) -> None:
        super().__init__(reason)
        self.outcome = outcome
        self.reason = reason
        self.fenced_by = fenced_by
        """With a stale-token refusal: the highest token the target has seen."""


class DeployTarget(Protocol):
    """What ``start_deployment`` needs from a target."""

    @property
    def account(self) -> str:
        """The installation deployment ids are scoped to."""
        ...

    async def apply_step(self, write: StepWrite) -> None:
        """Apply one step under its token; raises ``DeployTargetError`` otherwise."""
        ...


class HttpDeployTarget:
    """A target reached over HTTP with explicit timeouts and no retries."""

    def __init__(self, client: httpx.AsyncClient, *, account: str) -> None:
        self.client = client
        """The HTTP client, public so the worker's retry check sees its transport."""
        self._account = account

    @property
    def account(self) -> str:
        return self._account

    async def apply_step(self, write: StepWrite) -> None:
        with outbound_call(
            "deploy-target",
            "POST /deployments/{id}/steps/{step}",
            {
                "onceflow.deployment_id": write.deployment_id,
                "onceflow.deployment_step": write.step,
                "onceflow.fencing_token": write.fencing_token,
            },
        ) as span:
            try:
                await self._apply_step(write)
            except DeployTargetError as refused:
                span.set_attribute("onceflow.outcome", refused.outcome.value)
                if refused.fenced_by is not None:
                    span.set_attribute("onceflow.fenced_by", refused.fenced_by)
                raise

    async def _apply_step(self, write: StepWrite) -> None:
        path = f"/deployments/{write.deployment_id}/steps/{write.step}"
        try:
            response = await self.client.post(
                path,
                headers={"Fencing-Token": str(write.fencing_token)},
                json={
                    "fencing_token": write.fencing_token,
                    "owner": write.owner,
                    "service": write.service,
                    "version": write.version,
                    "environment": write.environment,
                },
            )
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as error:
            raise DeployTargetError(
                OutcomeClass.TRANSIENT,
                f"could not reach the target ({type(error).__name__}); step {write.step} "
                "was not sent",
            ) from None
        except httpx.HTTPError as error:
            raise DeployTargetError(
                OutcomeClass.UNKNOWN,
                f"{type(error).__name__} after step {write.step} was sent; it may be applied",
            ) from None
        if response.is_success:
            return
        body = _json(response)
        if response.status_code == 409 and body.get("error") == STALE_TOKEN:
            highest = body.get("highest_token")
            raise DeployTargetError(
                OutcomeClass.UNKNOWN,
                f"the target refused step {write.step}: fencing token {write.fencing_token} "
                f"is stale (it has seen {highest})",
                fenced_by=int(highest) if isinstance(highest, int) else None,
            )
        if 400 <= response.status_code < 500:
            raise DeployTargetError(
                OutcomeClass.REJECTED,
                f"the target refused step {write.step} ({response.status_code} "
                f"{body.get('error', '')})".rstrip(),
            )
        raise DeployTargetError(
            OutcomeClass.UNKNOWN,
            f"the target failed on step {write.step} ({response.status_code}); it may be applied",
        )


def _json(response: httpx.Response) -> dict[str, object]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


@asynccontextmanager
async def open_deploy_target(
    settings: DeployTargetSettings,
) -> AsyncIterator[HttpDeployTarget | None]:
    """The HTTP target of ``settings``, or None when ``DEPLOY_TARGET_URL`` is unset."""
    if settings.url is None:
        yield None
        return
    timeout = httpx.Timeout(
        settings.request_timeout.total_seconds(),
        connect=settings.connect_timeout.total_seconds(),
    )
    async with httpx.AsyncClient(
        base_url=settings.url,
        timeout=timeout,
        transport=httpx.AsyncHTTPTransport(retries=0),
    ) as client:
        yield HttpDeployTarget(client, account=settings.account)
