"""Principals and their API keys: who is calling, for which tenant, with which tools.

An API key is shown once, when it is issued; only its SHA-256 digest is stored, so a
database dump does not hand out working keys. Keys carry 256 bits of randomness, which
is why a plain digest (not a slow password hash) is enough.
"""

import hashlib
import re
import secrets
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg import AsyncConnection, errors
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from onceflow.errors import OnceflowError, Unauthenticated
from onceflow.storage import autocommit

if TYPE_CHECKING:
    from onceflow.gateway._principal_cache import PrincipalCache

ALL_TOOLS = "*"
"""In ``allowed_tools``: every tool of the catalogue, including ones registered later."""
API_KEY_PREFIX = "ofk_"
PRINCIPAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""Tenants and principal names: no ``:``, so the scopes built from them stay unambiguous."""


class PrincipalExists(OnceflowError, ValueError):
    """A principal of that name already exists in the tenant."""

    status = 409
    code = "principal-exists"
    title = "Principal exists"


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: a tenant's agent, script or operator."""

    principal_id: uuid.UUID
    tenant: str
    name: str
    allowed_tools: frozenset[str]
    may_decide: bool
    """Whether it may approve and reconcile tasks (an operator, never an agent by default)."""
    key_quota: int | None
    """New idempotency keys per quota window; None takes the gateway's default."""
    may_approve: bool = False
    """Whether it may approve or deny its tenant's steps awaiting approval, without
    reconciling parked ones (an app's approval screen). ``may_decide`` includes it."""

    def may_call(self, tool: str) -> bool:
        """Whether this principal is allowed to call ``tool``."""
        return ALL_TOOLS in self.allowed_tools or tool in self.allowed_tools

    @property
    def approves(self) -> bool:
        """Whether it may approve or deny steps (``may_approve`` or ``may_decide``)."""
        return self.may_approve or self.may_decide


def api_key_digest(api_key: str) -> str:
    """The stored form of an API key."""
    return "sha256:" + hashlib.sha256(api_key.encode()).hexdigest()


_FIND_BY_KEY = """
SELECT p.principal_id, p.tenant, p.name, p.allowed_tools, p.may_decide, p.may_approve,
       p.key_quota
FROM api_keys k JOIN principals p USING (principal_id)
WHERE k.key_hash = %(key_hash)s AND k.revoked_at IS NULL
"""

_FIND_BY_NAME = """
SELECT principal_id, tenant, name, allowed_tools, may_decide, may_approve, key_quota
FROM principals WHERE tenant = %(tenant)s AND name = %(name)s
"""

_LIST = """
SELECT principal_id, tenant, name, allowed_tools, may_decide, may_approve, key_quota
FROM principals WHERE %(tenant)s::text IS NULL OR tenant = %(tenant)s
ORDER BY tenant, name
"""


class PrincipalStore:
    """The ``principals`` and ``api_keys`` tables."""

    def __init__(self, pool: AsyncConnectionPool, *, cache: "PrincipalCache | None" = None) -> None:
        """``cache``: remembers principals while it hears every change (a gateway's);
        without it each authentication reads the tables."""
        self._pool = pool
        self._cache = cache

    def heard(self) -> int | None:
        """What the cache has heard of changes so far (``PrincipalCache.heard``): what a
        gateway's remembered answers are forgotten by; None without a cache, or while it
        hears nothing."""
        return self._cache.heard() if self._cache is not None else None

    async def create(
        self,
        *,
        tenant: str,
        name: str,
        tools: Iterable[str],
        may_decide: bool = False,
        may_approve: bool = False,
        key_quota: int | None = None,
    ) -> tuple[Principal, str]:
        """Create a principal with its first API key; returns both (the key only now).

        Raises:
            PrincipalExists: The tenant already has a principal of that name.
            ValueError: The tenant or name is outside ``[A-Za-z0-9][A-Za-z0-9_.-]{0,63}``.
        """
        for label, value in (("tenant", tenant), ("name", name)):
            if not PRINCIPAL_NAME.fullmatch(value):
                raise ValueError(
                    f"the {label} may hold only letters, digits and . _ - (64 at most), "
                    "starting with a letter or digit"
                )
        principal = Principal(
            principal_id=uuid.uuid4(),
            tenant=tenant,
            name=name,
            allowed_tools=frozenset(tools),
            may_decide=may_decide,
            key_quota=key_quota,
            may_approve=may_approve,
        )
        api_key = _new_api_key()
        try:
            async with self._pool.connection() as conn, conn.transaction():
                await conn.execute(
                    "INSERT INTO principals"
                    " (principal_id, tenant, name, allowed_tools, may_decide, may_approve,"
                    " key_quota) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    (
                        principal.principal_id,
                        tenant,
                        name,
                        sorted(principal.allowed_tools),
                        may_decide,
                        may_approve,
                        key_quota,
                    ),
                )
                await self._insert_key(conn, principal.principal_id, api_key)
        except errors.UniqueViolation:
            raise PrincipalExists(f"tenant {tenant!r} already has a principal {name!r}") from None
        return principal, api_key

    async def issue_key(self, principal: Principal) -> str:
        """Another API key for an existing principal (e.g. for rotation)."""
        api_key = _new_api_key()
        async with self._pool.connection() as conn:
            await self._insert_key(conn, principal.principal_id, api_key)
        return api_key

    @staticmethod
    async def _insert_key(
        conn: AsyncConnection[Any], principal_id: uuid.UUID, api_key: str
    ) -> None:
        await conn.execute(
            "INSERT INTO api_keys (key_hash, principal_id, key_prefix) VALUES (%s, %s, %s)",
            (api_key_digest(api_key), principal_id, api_key[: len(API_KEY_PREFIX) + 6]),
        )

    async def find(self, *, tenant: str, name: str) -> Principal | None:
        """The principal of that name in the tenant, if any."""
        async with self._pool.connection() as conn:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(_FIND_BY_NAME, {"tenant": tenant, "name": name})
            row = await cursor.fetchone()
        return _principal(row) if row is not None else None

    async def principals(self, *, tenant: str | None = None) -> list[Principal]:
        """Every principal (of ``tenant`` when given), by tenant and name."""
        async with self._pool.connection() as conn:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(_LIST, {"tenant": tenant})
            return [_principal(row) for row in await cursor.fetchall()]

    async def authenticate(self, api_key: str | None) -> Principal:
        """The principal an API key belongs to.

        Raises:
            Unauthenticated: No key, or a key that is unknown or revoked.
        """
        if not api_key:
            raise Unauthenticated("send an API key as 'Authorization: Bearer <key>'")
        if not api_key.startswith(API_KEY_PREFIX) or len(api_key) > 200:
            raise Unauthenticated("the API key is not valid")
        key_hash = api_key_digest(api_key)
        cache = self._cache
        if cache is not None and (remembered := cache.principal(key_hash)) is not None:
            return remembered
        read_in = cache.generation if cache is not None else 0
        # One statement, its own transaction.
        async with self._pool.connection() as conn, autocommit(conn):
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(_FIND_BY_KEY, {"key_hash": key_hash})
            row = await cursor.fetchone()
        if row is None:
            raise Unauthenticated("the API key is not valid")
        principal = _principal(row)
        if cache is not None:
            cache.remember(key_hash, principal, read_in=read_in)
        return principal

    async def authenticate_digest(self, key_hash: str) -> Principal:
        """The principal of the API key whose digest (``api_key_digest``) a signed codec
        session carries: a key revoked since the session began ends it.

        Raises:
            Unauthenticated: The key is unknown or revoked.
        """
        async with self._pool.connection() as conn, autocommit(conn):
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(_FIND_BY_KEY, {"key_hash": key_hash})
            row = await cursor.fetchone()
        if row is None:
            raise Unauthenticated("the session's API key is no longer valid; sign in again")
        return _principal(row)


def _new_api_key() -> str:
    return API_KEY_PREFIX + secrets.token_urlsafe(32)


def _principal(row: dict[str, Any]) -> Principal:
    return Principal(
        principal_id=row["principal_id"],
        tenant=row["tenant"],
        name=row["name"],
        allowed_tools=frozenset(row["allowed_tools"]),
        may_decide=row["may_decide"],
        key_quota=row["key_quota"],
        may_approve=row["may_approve"],
    )
