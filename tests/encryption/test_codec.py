"""The payload codec on its own: round trip, rotation, unknown keys, tampering, pass-through,
the settings that configure it and the codec endpoint's signed sessions. No server."""

import asyncio
import base64
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel, SecretStr
from temporalio.api.common.v1 import Payload
from temporalio.api.failure.v1 import Failure
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError

from onceflow.encryption import (
    CLEAR_TEXT_METADATA,
    ENCRYPTED_ENCODING,
    KEY_ID_METADATA,
    ClearText,
    PayloadEncryptionCodec,
    PayloadEncryptionSettings,
    PayloadTampered,
    UnknownEncryptionKey,
    onceflow_data_converter,
    parse_key_ring,
)
from onceflow.gateway._codec_endpoint import CodecSessions
from onceflow.settings import InvalidSettings, read_settings
from tests.harness import REPO

OLD_KEY = base64.b64encode(bytes(range(32))).decode()
NEW_KEY = base64.b64encode(bytes(range(100, 132))).decode()
CUSTOMER = "ann.lee@example.com"


class Refund(BaseModel):
    customer_email: str
    amount: int


def settings(*entries: str, key_id: str | None = None) -> PayloadEncryptionSettings:
    return PayloadEncryptionSettings(
        payload_keys=tuple(SecretStr(entry) for entry in entries), payload_key_id=key_id
    )


def encode(encryption: PayloadEncryptionSettings, *values: object) -> list[Payload]:
    return asyncio.run(onceflow_data_converter(encryption).encode(list(values)))


def decode(
    encryption: PayloadEncryptionSettings, payloads: list[Payload], *hints: type
) -> list[object]:
    converter = onceflow_data_converter(encryption)
    return asyncio.run(converter.decode(payloads, list(hints)))


def test_values_round_trip_encrypted_and_no_plaintext_is_stored() -> None:
    encryption = settings(f"k1:{OLD_KEY}")
    refund = Refund(customer_email=CUSTOMER, amount=4200)

    stored = encode(encryption, refund, CUSTOMER)

    for payload in stored:
        assert payload.metadata["encoding"] == ENCRYPTED_ENCODING
        assert payload.metadata[KEY_ID_METADATA] == b"k1"
        assert CUSTOMER.encode() not in payload.SerializeToString()
    # A fresh nonce per payload: the same value twice is two different ciphertexts.
    assert encode(encryption, CUSTOMER)[0].data != stored[1].data
    assert decode(encryption, stored, Refund, str) == [refund, CUSTOMER]


def test_after_a_rotation_old_payloads_decode_and_new_ones_use_the_new_key() -> None:
    written_before = encode(settings(f"k1:{OLD_KEY}"), CUSTOMER)
    rotated = settings(f"k2:{NEW_KEY}", f"k1:{OLD_KEY}")

    assert decode(rotated, written_before, str) == [CUSTOMER]
    [written_after] = encode(rotated, CUSTOMER)
    assert written_after.metadata[KEY_ID_METADATA] == b"k2"
    # ONCEFLOW_PAYLOAD_KEY_ID picks another encrypting key than the first.
    [named] = encode(settings(f"k2:{NEW_KEY}", f"k1:{OLD_KEY}", key_id="k1"), CUSTOMER)
    assert named.metadata[KEY_ID_METADATA] == b"k1"
    # Once k1 is dropped, what it encrypted no longer decodes.
    with pytest.raises(UnknownEncryptionKey):
        decode(settings(f"k2:{NEW_KEY}"), written_before, str)


def test_an_unknown_key_id_is_named_and_no_key_material_is() -> None:
    [stored] = encode(settings(f"k1:{OLD_KEY}"), CUSTOMER)

    with pytest.raises(UnknownEncryptionKey) as unknown:
        decode(settings(f"k2:{NEW_KEY}"), [stored], str)

    message = str(unknown.value)
    assert unknown.value.key_id == "k1"
    assert "'k1'" in message and "ONCEFLOW_PAYLOAD_KEYS" in message
    for key in (OLD_KEY, NEW_KEY):
        assert key not in message and base64.b64decode(key).hex() not in message


def test_an_altered_truncated_or_relabelled_payload_is_refused() -> None:
    both = settings(f"k1:{OLD_KEY}", f"k2:{NEW_KEY}")
    [stored] = encode(both, CUSTOMER)
    flipped = Payload()
    flipped.CopyFrom(stored)
    flipped.data = stored.data[:-1] + bytes([stored.data[-1] ^ 1])
    truncated = Payload(metadata=dict(stored.metadata), data=stored.data[:20])
    relabelled = Payload()
    relabelled.CopyFrom(stored)
    relabelled.metadata[KEY_ID_METADATA] = b"k2"  # a key the ring holds, not its key

    for altered in (flipped, truncated, relabelled):
        with pytest.raises(PayloadTampered) as refused:
            decode(both, [altered], str)
        assert OLD_KEY not in str(refused.value)


def test_unencrypted_and_clear_text_payloads_pass_through() -> None:
    encryption = settings(f"k1:{OLD_KEY}")
    # Written before encryption was configured (the plain pydantic converter).
    written_before = asyncio.run(pydantic_data_converter.encode([CUSTOMER]))
    assert decode(encryption, written_before, str) == [CUSTOMER]

    [summary] = encode(encryption, ClearText("acme: charge_payment"))
    assert summary.metadata["encoding"] == b"json/plain"
    assert summary.metadata[CLEAR_TEXT_METADATA] == b"true"
    assert summary.data == b'"acme: charge_payment"'
    assert decode(encryption, [summary], str) == ["acme: charge_payment"]
    # An encrypted payload is never encrypted twice.
    codec = PayloadEncryptionCodec(parse_key_ring([f"k1:{OLD_KEY}"]))
    [once] = encode(encryption, CUSTOMER)
    assert codec.encrypt(once) == once


def test_without_keys_the_converter_is_the_plain_pydantic_one() -> None:
    assert onceflow_data_converter(None) is pydantic_data_converter
    assert onceflow_data_converter(PayloadEncryptionSettings()) is pydantic_data_converter


def test_failure_messages_are_encrypted_too() -> None:
    converter = onceflow_data_converter(settings(f"k1:{OLD_KEY}"))
    failure = Failure()

    asyncio.run(
        converter.encode_failure(ApplicationError(f"SMTP 550: no mailbox {CUSTOMER}"), failure)
    )

    assert CUSTOMER.encode() not in failure.SerializeToString()
    assert failure.encoded_attributes.metadata["encoding"] == ENCRYPTED_ENCODING
    assert CUSTOMER in str(asyncio.run(converter.decode_failure(failure)))


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("ONCEFLOW_PAYLOAD_KEYS", "k1:c2hvcnQ=", "entry 1 (key id 'k1') is not the base64 of 32"),
        ("ONCEFLOW_PAYLOAD_KEYS", f"k 1:{OLD_KEY}", "entry 1 is not key_id:base64key"),
        ("ONCEFLOW_PAYLOAD_KEYS", f"k1:{OLD_KEY},k1:{NEW_KEY}", "entry 2 repeats key id 'k1'"),
        ("ONCEFLOW_PAYLOAD_KEY_ID", "k9", "key id 'k9' is not among ONCEFLOW_PAYLOAD_KEYS"),
        ("ONCEFLOW_UI_ORIGIN", "http://localhost:8233/ui", "an origin is scheme://host[:port]"),
    ],
)
def test_bad_settings_are_one_line_naming_the_variable_never_the_key(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, named: str
) -> None:
    monkeypatch.setenv("ONCEFLOW_PAYLOAD_KEYS", f"k1:{OLD_KEY}")
    monkeypatch.setenv(variable, value)

    with pytest.raises(InvalidSettings) as invalid:
        read_settings(PayloadEncryptionSettings)

    [problem] = invalid.value.problems
    assert problem.startswith(f"invalid setting {variable} ") and named in problem
    assert OLD_KEY not in problem and NEW_KEY not in problem and "c2hvcnQ" not in problem


def test_a_command_with_a_bad_key_stops_with_exit_code_2_and_one_line() -> None:
    environment = {
        name: value for name, value in os.environ.items() if not name.startswith("ONCEFLOW_")
    }
    secret = base64.b64encode(b"sixteen byte key").decode()
    finished = subprocess.run(
        [sys.executable, "-m", "onceflow.cli", "status", "any-task"],
        cwd=REPO,
        env={**environment, "ONCEFLOW_PAYLOAD_KEYS": f"k1:{secret}"},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert finished.returncode == 2, finished.stderr
    [line] = finished.stderr.strip().splitlines()
    assert "ONCEFLOW_PAYLOAD_KEYS" in line and "32 bytes" in line and secret not in line


def test_a_codec_session_is_signed_expires_and_survives_a_rotation() -> None:
    old_ring = parse_key_ring([f"k1:{OLD_KEY}"])
    rotated = parse_key_ring([f"k2:{NEW_KEY}", f"k1:{OLD_KEY}"])
    now = datetime(2026, 5, 1, tzinfo=UTC)
    token = CodecSessions(old_ring, lifetime=timedelta(hours=8)).issue("ofk_operator", now=now)

    digest = CodecSessions(rotated, lifetime=timedelta(hours=8)).key_digest(token, now=now)
    assert digest is not None and digest.startswith("sha256:")
    assert "ofk_operator" not in token
    sessions = CodecSessions(old_ring, lifetime=timedelta(hours=8))
    assert sessions.key_digest(token, now=now + timedelta(hours=8, seconds=1)) is None
    body, _, mac = token.partition(".")
    forged = body[:-2] + ("A" if body[-2] != "A" else "B") + body[-1] + "." + mac
    assert sessions.key_digest(forged, now=now) is None
    assert (
        CodecSessions(parse_key_ring([f"k2:{NEW_KEY}"]), lifetime=timedelta(hours=8)).key_digest(
            token, now=now
        )
        is None
    )
