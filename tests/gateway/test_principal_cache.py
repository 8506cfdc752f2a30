"""Principals remembered by each gateway, forgotten the moment any principal or key
changes (PostgreSQL ``LISTEN``/``NOTIFY``), never trusted while the channel is down."""

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass

import pytest

from onceflow.gateway import PrincipalStore, Unauthenticated
from onceflow.gateway._principal_cache import (
    APPLICATION_NAME,
    REMEMBERED_FOR,
    PrincipalCache,
    principal_cache,
)
from onceflow.gateway._principals import api_key_digest
from onceflow.storage import build_pool
from tests.harness import eventually

from .conftest import Caller, execute, make_caller, new_tenant


@dataclass(frozen=True)
class Gateway:
    """What one gateway process holds to authenticate: its pool and its cache."""

    store: PrincipalStore
    cache: PrincipalCache


@pytest.fixture
async def gateways(database: str) -> AsyncIterator[list[Gateway]]:
    async with AsyncExitStack() as stack:
        found = []
        for _ in range(2):
            pool = await stack.enter_async_context(build_pool(database, max_size=2))
            cache = await stack.enter_async_context(principal_cache(database))
            found.append(Gateway(PrincipalStore(pool, cache=cache), cache))
        for gateway in found:
            await eventually(lambda g=gateway: g.cache.listening, what="the gateway listens")
        yield found


async def remembered_by_all(gateways: list[Gateway], caller: Caller) -> None:
    digest = api_key_digest(caller.api_key)
    for gateway in gateways:
        assert await gateway.store.authenticate(caller.api_key) == caller.principal
        assert gateway.cache.principal(digest) == caller.principal


async def test_a_revoked_key_is_refused_by_every_gateway_as_soon_as_it_hears_of_it(
    database: str, gateways: list[Gateway]
) -> None:
    agent = await make_caller(database, tenant=new_tenant())
    await remembered_by_all(gateways, agent)
    heard_before = [gateway.cache.generation for gateway in gateways]

    revoked = execute(
        database,
        "UPDATE api_keys SET revoked_at = now() WHERE principal_id = %s",
        agent.principal.principal_id,
    )

    assert revoked == 1
    # Each gateway forgets on the notification itself, long before a remembered
    # principal would be read again anyway.
    await eventually(
        lambda: all(
            gateway.cache.generation > before
            for gateway, before in zip(gateways, heard_before, strict=True)
        ),
        what="every gateway heard the revocation",
        timeout=REMEMBERED_FOR / 3,
    )
    for gateway in gateways:
        with pytest.raises(Unauthenticated):
            await gateway.store.authenticate(agent.api_key)


async def test_a_change_to_the_principal_itself_is_heard_too(
    database: str, gateways: list[Gateway]
) -> None:
    agent = await make_caller(database, tenant=new_tenant(), tools=("issue_coupon",))
    await remembered_by_all(gateways, agent)

    execute(
        database,
        "UPDATE principals SET allowed_tools = %s WHERE principal_id = %s",
        ["issue_coupon", "create_order"],
        agent.principal.principal_id,
    )

    for gateway in gateways:
        allowed = await eventually(
            lambda g=gateway: g.store.authenticate(agent.api_key),
            until=lambda principal: principal.may_call("create_order"),
            what="the gateway reads the principal's new tools",
            timeout=REMEMBERED_FOR / 3,
        )
        assert allowed.may_call("issue_coupon")


async def test_an_approver_flag_given_or_taken_is_heard_by_every_gateway(
    database: str, gateways: list[Gateway]
) -> None:
    person = await make_caller(database, tenant=new_tenant(), name="approver", tools=())
    await remembered_by_all(gateways, person)
    assert not person.principal.approves

    for flag in (True, False):
        execute(
            database,
            "UPDATE principals SET may_approve = %s WHERE principal_id = %s",
            flag,
            person.principal.principal_id,
        )
        for gateway in gateways:
            heard = await eventually(
                lambda g=gateway: g.store.authenticate(person.api_key),
                until=lambda principal, flag=flag: principal.may_approve is flag,
                what=f"the gateway reads may_approve = {flag}",
                timeout=REMEMBERED_FOR / 3,
            )
            assert heard.approves is flag and not heard.may_decide


async def test_while_the_channel_is_down_nothing_is_answered_from_memory(
    database: str, gateways: list[Gateway]
) -> None:
    agent = await make_caller(database, tenant=new_tenant())
    await remembered_by_all(gateways, agent)

    execute(
        database,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = %s AND datname = current_database()",
        APPLICATION_NAME,
    )
    for gateway in gateways:
        await eventually(
            lambda g=gateway: not g.cache.listening or g.cache.generation > 1,
            what="the gateway lost its channel (or has listened again since)",
        )
        # Nothing remembered before the channel broke is trusted any more.
        assert gateway.cache.principal(api_key_digest(agent.api_key)) is None
    execute(
        database,
        "UPDATE api_keys SET revoked_at = now() WHERE principal_id = %s",
        agent.principal.principal_id,
    )
    for gateway in gateways:
        with pytest.raises(Unauthenticated):
            await gateway.store.authenticate(agent.api_key)

    # Back: each gateway listens again and remembers principals again.
    for gateway in gateways:
        await eventually(lambda g=gateway: g.cache.listening, what="the gateway listens again")
    other = await make_caller(database, tenant=new_tenant())
    await remembered_by_all(gateways, other)


async def test_a_read_that_raced_a_change_is_not_remembered(database: str) -> None:
    agent = await make_caller(database, tenant=new_tenant())
    async with principal_cache(database) as cache:
        await eventually(lambda: cache.listening, what="the cache listens")
        read_in = cache.generation
        execute(database, "UPDATE principals SET key_quota = 5 WHERE name = 'nobody'")
        await eventually(lambda: cache.generation > read_in, what="the change is heard")
        cache.remember("sha256:" + "0" * 64, agent.principal, read_in=read_in)
        assert cache.principal("sha256:" + "0" * 64) is None
