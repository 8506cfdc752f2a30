"""The onceflow principal a Nexus endpoint's callers act as.

A Nexus request carries no API key: whoever may reach the endpoint (Temporal's endpoint
access rules, or Temporal Cloud's allowed caller namespaces, decide that) calls as the
one principal the worker's ``nexus_principal`` setting names, with its tenant and its
allowed tools, read from the gateway's ``principals`` table for every start.
"""

from dataclasses import dataclass

from onceflow.gateway import Principal, PrincipalStore


@dataclass(frozen=True)
class NexusPrincipal:
    """The principal a worker's Nexus service acts as: ``TENANT/NAME``."""

    tenant: str
    name: str

    @classmethod
    def parse(cls, setting: str) -> "NexusPrincipal":
        """``TENANT/NAME`` as set in ``nexus_principal``.

        Raises:
            ValueError: Not two names joined by ``/``.
        """
        tenant, slash, name = setting.partition("/")
        # The names' alphabet is the principals table's to judge: an unknown one refuses
        # every operation (UNAUTHORIZED), saying so.
        if not tenant or not name or "/" in name:
            raise ValueError(f"nexus_principal must be TENANT/NAME, not {setting!r}")
        return cls(tenant=tenant, name=name)

    def __str__(self) -> str:
        return f"{self.tenant}/{self.name}"


class PrincipalLookup:
    """Reads ``principal`` from ``store`` for each operation (a change of its tools
    applies to the next call; a principal deleted refuses it)."""

    def __init__(self, store: PrincipalStore, principal: NexusPrincipal) -> None:
        self._store = store
        self._principal = principal

    async def __call__(self) -> Principal | None:
        return await self._store.find(tenant=self._principal.tenant, name=self._principal.name)
