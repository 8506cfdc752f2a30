"""Concurrent claims of one key: exactly one wins, the others read its record.

Regression test for a race the chaos run found: the record's workflow id (derived from
scope and key) is unique too, and a concurrent claim could collide on that index before
the ``(scope, key)`` one, raising a unique violation (a 500 at the gateway) instead of
answering from the winner's record.
"""

import asyncio
import uuid
from datetime import timedelta

from onceflow.gateway import PrincipalStore, request_fingerprint
from onceflow.idempotency import AlreadyClaimed, Claimed, IdempotencyStore, NewClaim
from onceflow.storage import build_pool
from onceflow.tools.worker import derive_task_workflow_id


async def test_concurrent_claims_of_one_key_never_raise(database: str) -> None:
    async with build_pool(database, max_size=8) as pool:
        owner, _ = await PrincipalStore(pool).create(
            tenant="race", name="racer", tools=["issue_coupon"]
        )
        store = IdempotencyStore(pool)
        fingerprint = request_fingerprint(operation="o", scope="s", route="r", body={})
        for round_number in range(40):
            key = f"race-{round_number}-{uuid.uuid4().hex[:6]}"
            claim = NewClaim(
                scope="race:racer:task:create",
                idempotency_key=key,
                request_hash=fingerprint,
                tenant="race",
                principal_id=owner.principal_id,
                workflow_id=derive_task_workflow_id(
                    tenant="race", scope="race:racer:task:create", idempotency_key=key
                ),
                lease=timedelta(seconds=30),
                result_retention=timedelta(days=1),
                key_quota=1_000_000,
                quota_window_seconds=60,
            )
            outcomes = await asyncio.gather(*(store.claim(claim) for _ in range(8)))

            assert sum(isinstance(outcome, Claimed) for outcome in outcomes) == 1
            assert sum(isinstance(outcome, AlreadyClaimed) for outcome in outcomes) == 7
