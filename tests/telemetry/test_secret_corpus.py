"""The secret filter against its corpus, two properties, hostile sizes, and at the gateway.

The filter is what both the gateway (refusing tool arguments) and the log and trace
redaction (``scrub``) rely on, so each corpus case is checked through both faces. The
gateway test drives the package's real gateway process: a refused call must leave no
idempotency record and start no task, proven by a clean call with the same key that
then runs as a fresh operation.
"""

import json

import httpx
import psycopg
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from onceflow.telemetry import (
    Finding,
    looks_like_card_number,
    looks_like_secret,
    scrub,
    sensitive_locations,
    unstorable_locations,
)
from onceflow.telemetry._redaction import CARD_NUMBER_REMOVED, SECRET_REMOVED
from tests.harness import settled_count

from .conftest import TelemetryStack
from .secret_corpus import NEGATIVES, POSITIVES

PROBLEM = "application/problem+json"
SEPARATORS = ["", " ", "-", ".", "_", ":", "/", "\t", "\u00a0", "\u2013", " - ", " / ", "  "]


def luhn_valid(digits: str) -> bool:
    """The Luhn check, written out apart from the filter's own."""
    total = 0
    for place, char in enumerate(reversed(digits)):
        doubled = int(char) * (2 if place % 2 else 1)
        total += doubled - 9 if doubled > 9 else doubled
    return total % 10 == 0


# ── the corpus ─────────────────────────────────────────────────────────────────────


def test_the_corpus_is_large_enough() -> None:
    assert len(POSITIVES) >= 40 and len(NEGATIVES) >= 40
    assert len({label for label, *_ in POSITIVES + NEGATIVES}) == len(POSITIVES + NEGATIVES)


@pytest.mark.parametrize(
    ("text", "kind"), [(t, k) for _, t, k in POSITIVES], ids=[c[0] for c in POSITIVES]
)
def test_each_positive_is_refused_and_scrubbed(text: str, kind: str) -> None:
    [found] = sensitive_locations({"note": text})
    assert (found.location, found.kind, found.in_key) == (["note"], kind, False)
    scrubbed = scrub(text)
    marker = CARD_NUMBER_REMOVED if kind == "card number" else SECRET_REMOVED
    assert marker in scrubbed
    assert not looks_like_card_number(scrubbed) and not looks_like_secret(scrubbed)
    assert scrub(scrubbed) == scrubbed


@pytest.mark.parametrize("text", [t for _, t in NEGATIVES], ids=[c[0] for c in NEGATIVES])
def test_each_near_miss_passes_untouched(text: str) -> None:
    assert sensitive_locations({"note": text}) == []
    assert scrub(text) == text


def test_keys_integers_and_credential_named_fields_are_checked() -> None:
    arguments = {
        "lines": [{"sku": "mug", "4242.4242.4242.4242": 1}],
        "reference": 4242424242424242,
        "db": {"password": "hunter2", "apiKey": "9d2f1a7c3b", "password_hint": "pet's name"},
        "blank": {"password": "", "secret": "********", "token": "CiAKGjBpNDd2"},
    }
    assert sensitive_locations(arguments) == [
        Finding(["lines", 0, CARD_NUMBER_REMOVED], "card number", in_key=True),
        Finding(["reference"], "card number"),
        Finding(["db", "password"], "secret", "value of a field named like a credential"),
        Finding(["db", "apiKey"], "secret", "value of a field named like a credential"),
    ]


def test_nul_and_unpaired_surrogates_are_found_with_printable_locations() -> None:
    arguments = {
        "note": "line one\x00line two",
        "tags": ["ok", "broken \ud800 half", "emoji \U0001f600 whole"],
        "key\x00": "value",
    }
    assert unstorable_locations(arguments) == [
        Finding(["note"], "NUL byte"),
        Finding(["tags", 1], "unpaired surrogate"),
        Finding(["key\\x00"], "NUL byte", in_key=True),
    ]
    json.dumps([found.location for found in unstorable_locations(arguments)]).encode()
    assert unstorable_locations({"note": "emoji \U0001f600, accents é, tab\t"}) == []


# ── properties ─────────────────────────────────────────────────────────────────────


@st.composite
def grouped_card_numbers(draw: st.DrawFn) -> tuple[str, str]:
    """A Luhn-valid number of 13 to 19 digits, split anywhere, joined by any separators."""
    length = draw(st.integers(13, 19))
    body = [draw(st.integers(1, 9))] + draw(
        st.lists(st.integers(0, 9), min_size=length - 2, max_size=length - 2)
    )
    digits = "".join(map(str, body)) + "0"
    digits = digits[:-1] + str(next(d for d in range(10) if luhn_valid(digits[:-1] + str(d))))
    cuts = sorted(draw(st.sets(st.integers(1, length - 1))))
    groups = [digits[start:end] for start, end in zip([0, *cuts], [*cuts, length], strict=True)]
    joined = groups[0] + "".join(draw(st.sampled_from(SEPARATORS)) + g for g in groups[1:])
    return digits, joined


@settings(max_examples=300)
@given(
    card=grouped_card_numbers(),
    before=st.sampled_from(["", "card ", "pay with: ", "(", "\n", "#"]),
    after=st.sampled_from(["", " exp 12/28", ".", ")", "\n", ", thanks"]),
)
def test_any_luhn_valid_number_with_any_separators_is_caught(
    card: tuple[str, str], before: str, after: str
) -> None:
    digits, joined = card
    # The documented exceptions: ISBN-13/EAN "Bookland" numbers, and epoch timestamps
    # (one unseparated group of 13, 16 or 19 digits starting with 1).
    assume(not (len(digits) == 13 and digits[:3] in ("978", "979")))
    assume(not (joined == digits and digits[0] == "1" and len(digits) in (13, 16, 19)))
    text = f"{before}{joined}{after}"
    assert looks_like_card_number(text)
    assert [found.kind for found in sensitive_locations({"note": text})] == ["card number"]
    scrubbed = scrub(text)
    assert CARD_NUMBER_REMOVED in scrubbed and not looks_like_card_number(scrubbed)


@st.composite
def phone_numbers(draw: st.DrawFn) -> tuple[list[str], str]:
    """7 to 15 digits (E.164's range) that fail Luhn, grouped with a phone's separators."""
    digits = "".join(draw(st.lists(st.sampled_from("0123456789"), min_size=7, max_size=15)))
    if luhn_valid(digits):
        digits = digits[:-1] + str((int(digits[-1]) + 1) % 10)
    cuts = sorted(draw(st.sets(st.integers(1, len(digits) - 1), max_size=4)))
    groups = [digits[a:b] for a, b in zip([0, *cuts], [*cuts, len(digits)], strict=True)]
    separators = st.sampled_from(["", " ", "-", ".", "/"])
    return groups, groups[0] + "".join(draw(separators) + g for g in groups[1:])


@settings(max_examples=300)
@given(phone=phone_numbers(), prefix=st.sampled_from(["", "+", "tel: ", "call "]))
def test_no_luhn_invalid_run_of_phone_length_is_caught(
    phone: tuple[list[str], str], prefix: str
) -> None:
    groups, joined = phone
    # Only the whole number is made to fail Luhn; a window of 13 or 14 of its digits
    # (whole groups, no leading zero) may still pass, and would rightly be a card.
    windows = [
        "".join(groups[first : last + 1])
        for first in range(len(groups))
        for last in range(first, len(groups))
    ]
    assume(
        not any(
            13 <= len(window) <= 19 and window[0] != "0" and luhn_valid(window)
            for window in windows
        )
    )
    text = prefix + joined
    assert not looks_like_card_number(text)
    assert sensitive_locations({"phone": text}) == []
    assert scrub(text) == text


# ── hostile sizes ──────────────────────────────────────────────────────────────────

HUNDRED_KB = 100_000
HOSTILE = {
    "one digit run": "4" * HUNDRED_KB,
    "single digits spaced": "1 " * (HUNDRED_KB // 2),
    "single digits mixed separators": "1-2.3_4:5/6 7" * (HUNDRED_KB // 13),
    "separators only": "- ./:_" * (HUNDRED_KB // 6),
    "card after card": "4242 4242 4242 4242 " * (HUNDRED_KB // 20),
    "one word": "a" * HUNDRED_KB,
    "base64url without dots": "eyJ" + "A" * HUNDRED_KB,
    "jwt heads": "eyJhbGciOi." * (HUNDRED_KB // 11),
    "bearer then a long word": "Bearer " + "a" * HUNDRED_KB,
    "bearer repeated": "Bearer " * (HUNDRED_KB // 7),
    "assignments without values": "password= " * (HUNDRED_KB // 10),
    "unterminated quoted value": 'password="' + "a" * HUNDRED_KB,
    "unterminated private key": "-----BEGIN PRIVATE KEY-----" + "A" * HUNDRED_KB,
    "url schemes": "a://b:" * (HUNDRED_KB // 6),
    "iban heads": "DE89 " * (HUNDRED_KB // 5),
    "hex": "0123456789abcdef" * (HUNDRED_KB // 16),
    "uuids between cards": "123e4567-e89b-12d3-a456-426614174000 4242 4242 4242 4242 " * 1750,
    "ibans between phones": "DE89 3704 0044 0532 0130 00 call +1 415 555 0100 " * 2000,
    "nul bytes": "\x00" * HUNDRED_KB,
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_hundred_kilobyte_inputs_are_one_pass(text: str) -> None:
    # Not a benchmark: a pattern that backtracks or rescans would not finish at all.
    scrubbed = scrub(text)
    sensitive_locations({"note": text})
    unstorable_locations({"note": text})
    if "4242 4242" in text:
        assert scrubbed.count(CARD_NUMBER_REMOVED) == text.count("4242 4242 4242 4242")


# ── at the gateway ─────────────────────────────────────────────────────────────────


async def test_the_gateway_refuses_cards_and_unstorable_text_and_writes_nothing(
    stack: TelemetryStack, http: httpx.AsyncClient
) -> None:
    tenant, auth = await stack.new_agent(tools=("issue_coupon",))
    url = f"{stack.gateway_url}/v1/tools/issue_coupon/calls"
    headers = {**auth, "Idempotency-Key": "secret-corpus-1", "Content-Type": "application/json"}
    coupon = {"user_id": "u-1", "coupon_id": "WELCOME10"}
    refusals = [
        # (body, where, what the problem says)
        ({**coupon, "coupon_id": "4242.4242.4242.4242"}, ["coupon_id"], "looks like a card number"),
        (
            {**coupon, "note": {"4242_4242_4242_4242": True}},
            ["note", CARD_NUMBER_REMOVED],
            "key looks like a card number",
        ),
        ({**coupon, "user_id": "u-1\x00"}, ["user_id"], "holds a NUL byte"),
        # A lone surrogate cannot be encoded by a client's JSON writer: raw JSON text.
        ('{"user_id": "u-\\ud800", "coupon_id": "WELCOME10"}', ["user_id"], "holds an unpaired"),
    ]
    for body, where, says in refusals:
        content = body if isinstance(body, str) else json.dumps(body)
        refused = await http.post(url, content=content, headers=headers)
        assert refused.status_code == 400, refused.text
        assert refused.headers["content-type"].startswith(PROBLEM)
        problem = refused.json()
        assert problem["type"] == "urn:onceflow:problem:invalid-request"
        [error] = problem["errors"]
        assert error["loc"] == where and error["msg"].startswith(says)
        assert "4242" not in refused.text, "a refused value is never echoed"

    async with await psycopg.AsyncConnection.connect(stack.database_url) as conn:
        cursor = await conn.execute(
            "SELECT count(*) FROM idempotency_records WHERE tenant = %s", (tenant,)
        )
        assert await cursor.fetchone() == (0,)

    # The key was never reserved: with a clean body it is a fresh operation, and the
    # tenant's only task is that one (visibility settled first).
    accepted = await http.post(url, json=coupon, headers=headers)
    assert accepted.status_code in (200, 202), accepted.text
    assert "Idempotent-Replayed" not in accepted.headers
    assert await settled_count(stack.client, f"OnceflowTenant = '{tenant}'") == 1
