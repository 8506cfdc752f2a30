"""The key ring: AES-256 keys by id, and the one new payloads are encrypted with.

Keys are configured as ``key_id:base64key`` entries. Rotation adds the new key (and makes
it the encrypting one) while the old keys stay in the ring, so every payload written
under an old key still decrypts; a key is dropped only once no history still needs it.
Nothing here ever formats a key: problems name an entry's position and its id.
"""

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from onceflow.encryption._errors import UnknownEncryptionKey

KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A key id: letters, digits and ``. _ -``, 64 at most (it is stored in every payload)."""
KEY_BYTES = 32
"""AES-256: every key is 32 random bytes (``openssl rand -base64 32``)."""
_SESSION_INFO = b"onceflow codec endpoint session v1"
_BASE64 = re.compile(r"[A-Za-z0-9+/_-]+")


@dataclass(frozen=True)
class KeyRing:
    """The configured keys by id; ``encrypting_key_id`` names the one new payloads use."""

    encrypting_key_id: str
    """The key new payloads are encrypted with."""
    _keys: Mapping[str, bytes] = field(repr=False)

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every key id, in configured order."""
        return tuple(self._keys)

    def cipher(self, key_id: str) -> AESGCM:
        """AES-256-GCM under the key ``key_id``.

        Raises:
            UnknownEncryptionKey: No configured key has that id.
        """
        key = self._keys.get(key_id)
        if key is None:
            raise UnknownEncryptionKey(
                f"the payload was encrypted with key id {key_id!r}, which is not among the "
                f"configured keys ({', '.join(self._keys)}); fix: add that key back to "
                "ONCEFLOW_PAYLOAD_KEYS (keep old keys after a rotation)",
                key_id=key_id,
            )
        return AESGCM(key)

    def session_mac(self, key_id: str, message: bytes) -> bytes:
        """HMAC-SHA256 of ``message`` under a secret derived (HKDF) from key ``key_id``, so
        every process holding the keys signs and checks the same codec sessions without a
        secret of their own, and never with the encryption key itself.

        Raises:
            UnknownEncryptionKey: No configured key has that id.
        """
        key = self._keys.get(key_id)
        if key is None:
            raise UnknownEncryptionKey(f"no configured key has id {key_id!r}", key_id=key_id)
        secret = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_SESSION_INFO).derive(
            key
        )
        return hmac.new(secret, message, hashlib.sha256).digest()


def parse_key_ring(entries: Sequence[str], *, encrypting_key_id: str | None = None) -> KeyRing:
    """The ring of ``key_id:base64key`` entries; the first encrypts unless another is named.

    Raises:
        ValueError: One line per malformed entry, by position and id, never its key.
    """
    problems: list[str] = []
    keys: dict[str, bytes] = {}
    for position, entry in enumerate(entries, start=1):
        key_id, separator, encoded = entry.strip().partition(":")
        if not separator or not KEY_ID.fullmatch(key_id):
            problems.append(
                f"entry {position} is not key_id:base64key with a key id of letters, digits "
                "and . _ - (64 at most)"
            )
            continue
        if key_id in keys:
            problems.append(f"entry {position} repeats key id {key_id!r}")
            continue
        key = _decode_key(encoded)
        if key is None:
            problems.append(
                f"entry {position} (key id {key_id!r}) is not the base64 of {KEY_BYTES} bytes "
                "(AES-256; make one with `openssl rand -base64 32`)"
            )
            continue
        keys[key_id] = key
    if problems:
        raise ValueError("; ".join(problems))
    if not keys:
        raise ValueError("no keys are configured")
    chosen = encrypting_key_id or next(iter(keys))
    if chosen not in keys:
        raise ValueError(f"key id {chosen!r} is not among the configured keys")
    return KeyRing(encrypting_key_id=chosen, _keys=keys)


def _decode_key(encoded: str) -> bytes | None:
    """The key of standard or URL-safe base64 text (padding optional), if it is 32 bytes."""
    text = encoded.strip().rstrip("=")
    if not _BASE64.fullmatch(text):
        return None
    standard = text.replace("-", "+").replace("_", "/")
    try:
        key = base64.b64decode(standard + "=" * (-len(standard) % 4), validate=True)
    except binascii.Error:
        return None
    return key if len(key) == KEY_BYTES else None
