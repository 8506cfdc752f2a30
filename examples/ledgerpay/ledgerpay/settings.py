"""How the ledgerpay tools reach the service, and what onceflow must know about its keys.

Read once per process from ``LEDGERPAY_*`` or the configuration file's
``[tools.ledgerpay]`` table; durations are ISO 8601 (``PT1H``) or ``HH:MM:SS``. The key
window (``key_retention``, ``retention_margin``, ``settle_time``) goes into the tools'
contracts, so every worker and gateway must read the same values; a task pins them when
it starts and keeps them to its end.
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta

import httpx
from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from ledgerpay.service import KEY_RETENTION
from onceflow.settings import FileBackedSettings, read_settings


class LedgerpaySettings(FileBackedSettings):
    """The ledgerpay tools' settings (``LEDGERPAY_*``, or ``[tools.ledgerpay]``)."""

    config_table = "tools.ledgerpay"
    model_config = SettingsConfigDict(env_prefix="LEDGERPAY_", extra="ignore", frozen=True)

    url: str = "http://127.0.0.1:8710"
    """Base URL of the service (``LEDGERPAY_URL``). Default ``http://127.0.0.1:8710``,
    where ``python -m ledgerpay.service`` listens."""
    account: str = Field(default="default", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
    """The ledgerpay account effects land in (``LEDGERPAY_ACCOUNT``): part of every
    derived key, so the same on every worker and never changed under running tasks.
    Default ``default``."""
    request_timeout: timedelta = Field(default=timedelta(seconds=10), gt=timedelta(0))
    """Longest wait for one request (``LEDGERPAY_REQUEST_TIMEOUT``). A request that times
    out after it was sent counts as unknown. Default 10 s."""
    attempt_timeout: timedelta = Field(default=timedelta(seconds=30), gt=timedelta(0))
    """Longest one attempt or look-up may run (``LEDGERPAY_ATTEMPT_TIMEOUT``); it must
    exceed two requests, a read by reference and the POST. Default 30 s."""
    key_retention: timedelta = Field(default=KEY_RETENTION, gt=timedelta(0))
    """How long ledgerpay keeps an idempotency key (``LEDGERPAY_KEY_RETENTION``): never
    more than the service documents, or a repeat could make a second charge. Default 1 h."""
    retention_margin: timedelta = Field(default=timedelta(minutes=10), ge=timedelta(0))
    """Taken off ``key_retention`` for clock skew and time in flight: onceflow sends a key
    again only within ``key_retention - retention_margin`` of its first send
    (``LEDGERPAY_RETENTION_MARGIN``). Default 10 min."""
    settle_time: timedelta = Field(default=timedelta(minutes=1), ge=timedelta(0))
    """Longest a request may still commit at ledgerpay after the attempt that sent it
    gave up (``LEDGERPAY_SETTLE_TIME``): before an operator-authorised attempt goes out
    under a new key, onceflow waits this long and looks again. Default 1 min."""

    @model_validator(mode="after")
    def _consistent(self) -> "LedgerpaySettings":
        if self.retention_margin >= self.key_retention:
            raise ValueError("retention_margin must be shorter than key_retention")
        if self.attempt_timeout <= 2 * self.request_timeout:
            raise ValueError("attempt_timeout must exceed two requests (2 × request_timeout)")
        return self


def load_settings() -> LedgerpaySettings:
    """This process's settings; every problem raises one ``InvalidSettings``."""
    return read_settings(LedgerpaySettings)


@dataclass(frozen=True)
class LedgerpayClient:
    """What every attempt gets as ``call.client``: the HTTP client and the account."""

    http: httpx.AsyncClient
    """Retries nothing (httpx's default): onceflow's budget owns every retry."""
    account: str


@asynccontextmanager
async def open_ledgerpay_client(settings: LedgerpaySettings) -> AsyncIterator[LedgerpayClient]:
    """The service's client, once per worker process."""
    async with httpx.AsyncClient(
        base_url=settings.url, timeout=settings.request_timeout.total_seconds()
    ) as http:
        yield LedgerpayClient(http=http, account=settings.account)
