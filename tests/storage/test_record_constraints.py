"""The idempotency record's constraints hold what the boundary relies on, whatever writes
the row: a request fingerprint is ``v<digits>:`` and 64 lowercase hex digits, exactly the
rule migration 2 wrote as one regular expression (migration 13 checks it more cheaply)."""

import re
import uuid

import psycopg
import pytest

FINGERPRINT_RULE = re.compile(r"v[0-9]+:[0-9a-f]{64}")
"""Migration 2's check, ``^v[0-9]+:[0-9a-f]{64}$``, as the reference."""

DIGEST = "0123456789abcdef" * 4
CANDIDATES = [
    f"v1:{DIGEST}",
    f"v12:{DIGEST}",
    f"v1:{DIGEST[:-1]}",
    f"v1:{DIGEST}0",
    f"v1:{DIGEST.upper()}",
    f"v:{DIGEST}",
    f"V1:{DIGEST}",
    f"1:{DIGEST}",
    f"v1{DIGEST}",
    f"v1::{DIGEST[:-1]}",
    f"v1:{DIGEST[:-1]}:",
    f"v1:{DIGEST[:-2]}g0",
    f"v1:{DIGEST}\n",
    f" v1:{DIGEST}",
    f"v1:{DIGEST[:-1]}é",
    f"vv1:{DIGEST}",
    f"v1:v1:{DIGEST[:-3]}",
    "",
]


@pytest.mark.parametrize("fingerprint", CANDIDATES, ids=repr)
async def test_a_record_holds_only_a_fingerprint_of_the_documented_form(
    database: str, fingerprint: str
) -> None:
    principal = uuid.uuid4()
    async with await psycopg.AsyncConnection.connect(database, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO principals (principal_id, tenant, name, allowed_tools)"
            " VALUES (%s, 'acme', %s, '{}')",
            (principal, f"p-{principal.hex[:8]}"),
        )

        async def insert() -> None:
            await conn.execute(
                "INSERT INTO idempotency_records (scope, idempotency_key, request_hash, state,"
                " owner_token, fencing_token, lease_expires_at, tenant, principal_id,"
                " workflow_id, result_retention, result_expires_at) VALUES ('s', %s, %s,"
                " 'processing', 'owner', 1, now() + interval '30 s', 'acme', %s, %s,"
                " interval '1 day', now() + interval '1 day')",
                (principal.hex, fingerprint, principal, f"wf-{principal.hex}"),
            )

        if FINGERPRINT_RULE.fullmatch(fingerprint):
            await insert()
            cursor = await conn.execute(
                "SELECT request_hash FROM idempotency_records WHERE idempotency_key = %s",
                (principal.hex,),
            )
            assert await cursor.fetchall() == [(fingerprint,)]
        else:
            with pytest.raises(psycopg.errors.CheckViolation) as refused:
                await insert()
            assert refused.value.diag.constraint_name == "request_hash_is_a_versioned_digest"


def test_the_candidates_cover_both_answers() -> None:
    accepted = [value for value in CANDIDATES if FINGERPRINT_RULE.fullmatch(value)]
    assert len(accepted) == 2
    assert len(CANDIDATES) - len(accepted) >= 15
