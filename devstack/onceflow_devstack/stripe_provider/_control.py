"""Typed async client for the provider's ``/_test`` control API.

Async because the in-process provider shares the test's event loop: a blocking client
would wait forever for a server that cannot run.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import httpx

from ._faults import Fault, FaultRule
from ._ledger import LedgerEntry, RequestRecord


class ProviderControl:
    """Drives a running provider's faults and reads its ledger and request log.

    Use as ``async with ProviderControl(base_url) as control: ...`` or call
    :meth:`aclose` when done.
    """

    def __init__(self, base_url: str, *, timeout: float = 5.0) -> None:
        """Create the client.

        Args:
            base_url: The provider's ``http://host:port``.
            timeout: Per-request timeout in seconds. Default ``5.0``.
        """
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout)

    async def __aenter__(self) -> ProviderControl:
        """Return self."""
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the HTTP client."""
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._http.aclose()

    async def add_fault(
        self,
        fault: Fault | str,
        *,
        method: str | None = "POST",
        path_prefix: str = "/v1/",
        times: int | None = 1,
        delay_seconds: float = 0.0,
    ) -> FaultRule:
        """Inject a fault into the next matching requests.

        Args:
            fault: Which failure (see :class:`Fault`).
            method: HTTP method to match; None matches any. Default ``"POST"``.
            path_prefix: Paths starting with this match. Default ``"/v1/"``.
            times: How many requests suffer it; None means forever. Default ``1``.
            delay_seconds: Sleep for the delay faults. Default ``0.0``.

        Returns:
            The rule as the provider stored it.
        """
        rule = FaultRule(Fault(fault), method, path_prefix, times, delay_seconds)
        return FaultRule.from_json(await self._call("POST", "/_test/faults", rule.to_json()))

    async def faults(self) -> list[FaultRule]:
        """Return the fault rules still in force."""
        data = await self._call("GET", "/_test/faults")
        return [FaultRule.from_json(rule) for rule in data["data"]]

    async def clear_faults(self) -> None:
        """Remove every fault rule."""
        await self._call("DELETE", "/_test/faults")

    async def ledger(self) -> list[LedgerEntry]:
        """Return every committed effect (charges and refunds) in commit order."""
        data = await self._call("GET", "/_test/ledger")
        return [LedgerEntry.from_json(entry) for entry in data["data"]]

    async def requests(self) -> list[RequestRecord]:
        """Return every API request received, in arrival order."""
        data = await self._call("GET", "/_test/requests")
        return [RequestRecord.from_json(record) for record in data["data"]]

    async def forget(self, object_id: str) -> list[str]:
        """Forget a PaymentIntent (its charges and refunds with it) or a refund, as
        Stripe's "delete test data" does: reads answer 404, lists leave it out, the
        ledger keeps the effect. Stripe's API deletes neither, so this stands in for a
        resource gone from the provider.

        Returns:
            The ids forgotten.
        """
        data = await self._call("POST", "/_test/forget", {"object_id": object_id})
        return list(data["forgotten"])

    async def reset(self) -> None:
        """Clear objects, ledger, request log, keys and faults; restore the config."""
        await self._call("POST", "/_test/reset")

    async def configure(
        self,
        *,
        key_retention_seconds: float | None = None,
        search_lag_seconds: float | None = None,
    ) -> dict[str, Any]:
        """Change settings at run time; None leaves a setting unchanged.

        Returns:
            The configuration now in force.
        """
        body = {
            name: value
            for name, value in (
                ("key_retention_seconds", key_retention_seconds),
                ("search_lag_seconds", search_lag_seconds),
            )
            if value is not None
        }
        return await self._call("POST", "/_test/config", body)

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        response = await self._http.request(method, path, json=body)
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data
