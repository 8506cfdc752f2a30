"""``PayloadEncryptionCodec``: every payload sealed with AES-256-GCM before it reaches Temporal.

An encrypted payload carries ``encoding: binary/encrypted`` and ``encryption-key-id``
(the id, never the key) as its metadata; its data is a random 96-bit nonce followed by
the AES-GCM ciphertext of the whole original payload (its protobuf serialization, so its
own metadata, the pydantic converter's ``json/plain`` included, comes back intact). The
key id is the additional authenticated data: a payload relabelled with another id fails
to authenticate like any other alteration.

Decoding leaves a payload without the encrypted encoding as it is, so histories written
before encryption was configured still replay and a cluster in mid-rollout mixes both.
Encoding leaves alone a payload already encrypted, and one the payload converter marked as
clear text (``ClearText``: summaries, details and memo values made of identifiers only).
"""

import os
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

from onceflow.encryption._errors import PayloadTampered
from onceflow.encryption._keys import KeyRing

ENCRYPTED_ENCODING = b"binary/encrypted"
"""The ``encoding`` metadata of an encrypted payload."""
KEY_ID_METADATA = "encryption-key-id"
"""The metadata naming the key a payload was encrypted with."""
CLEAR_TEXT_METADATA = "onceflow-clear-text"
"""Set (to ``true``) by the payload converter on a ``ClearText`` value: stored unencrypted."""
_NONCE_BYTES = 12
_TAG_BYTES = 16


class PayloadEncryptionCodec(PayloadCodec):
    """Encrypts payloads with the ring's encrypting key; decrypts with whichever key each
    payload names.

    Args:
        keys: The configured key ring.
    """

    def __init__(self, keys: KeyRing) -> None:
        self._keys = keys

    @property
    def key_ids(self) -> tuple[str, ...]:
        """The ids of the keys this codec holds."""
        return self._keys.key_ids

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """See ``PayloadCodec.encode``."""
        return [self.encrypt(payload) for payload in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """See ``PayloadCodec.decode``.

        Raises:
            UnknownEncryptionKey: A payload names a key this codec does not hold.
            PayloadTampered: A payload does not authenticate.
        """
        return [self.decrypt(payload) for payload in payloads]

    def encrypt(self, payload: Payload) -> Payload:
        """``payload`` encrypted, or a copy of it when it is encrypted or clear text already."""
        if is_encrypted(payload) or payload.metadata.get(CLEAR_TEXT_METADATA) == b"true":
            return _copy(payload)
        key_id = self._keys.encrypting_key_id
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._keys.cipher(key_id).encrypt(
            nonce, payload.SerializeToString(deterministic=True), key_id.encode()
        )
        return Payload(
            metadata={"encoding": ENCRYPTED_ENCODING, KEY_ID_METADATA: key_id.encode()},
            data=nonce + sealed,
        )

    def decrypt(self, payload: Payload) -> Payload:
        """The original payload of an encrypted one; a copy of any other payload.

        Raises:
            UnknownEncryptionKey: The payload names a key this codec does not hold.
            PayloadTampered: The payload does not authenticate.
        """
        if not is_encrypted(payload):
            return _copy(payload)
        key_id = payload.metadata.get(KEY_ID_METADATA, b"").decode("utf-8", "replace")
        cipher = self._keys.cipher(key_id)
        data = payload.data
        tampered = PayloadTampered(
            f"an encrypted payload (key id {key_id!r}) does not authenticate: it was altered "
            "or truncated, or the key configured under that id is not the one it was "
            "encrypted with",
            key_id=key_id,
        )
        if len(data) < _NONCE_BYTES + _TAG_BYTES:
            raise tampered
        try:
            plain = cipher.decrypt(data[:_NONCE_BYTES], data[_NONCE_BYTES:], key_id.encode())
        except InvalidTag:
            raise tampered from None
        return Payload.FromString(plain)


def is_encrypted(payload: Payload) -> bool:
    """Whether ``payload`` is one this codec encrypted (``encoding: binary/encrypted``)."""
    return payload.metadata.get("encoding") == ENCRYPTED_ENCODING


def _copy(payload: Payload) -> Payload:
    # The SDK replaces a wrapper's payloads with the codec's answer; a fresh message keeps
    # that from aliasing the one it removes.
    copied = Payload()
    copied.CopyFrom(payload)
    return copied
