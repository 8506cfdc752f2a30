"""Task payloads encrypted at rest in Temporal: opt-in by configuring a key, rotated by key id.

``onceflow_data_converter(settings)`` is the data converter of every onceflow client and
worker: the pydantic converter, plus, once ``ONCEFLOW_PAYLOAD_KEYS`` holds a key,
``PayloadEncryptionCodec`` (AES-256-GCM, ``encoding: binary/encrypted``,
``encryption-key-id``). ``ClearText`` marks the few operator-facing strings that stay
readable. The gateway serves the codec endpoint through which operators read the
payloads in the Temporal UI (``gateway._codec_endpoint``). Errors::

    PayloadDecryptionFailed
    ├── UnknownEncryptionKey   its key id is not among the configured keys
    └── PayloadTampered        it does not authenticate under the key its id names
"""

from onceflow.encryption._codec import (
    CLEAR_TEXT_METADATA,
    ENCRYPTED_ENCODING,
    KEY_ID_METADATA,
    PayloadEncryptionCodec,
    is_encrypted,
)
from onceflow.encryption._converter import (
    ClearText,
    ClearTextMarkingPayloadConverter,
    onceflow_data_converter,
)
from onceflow.encryption._errors import (
    PayloadDecryptionFailed,
    PayloadTampered,
    UnknownEncryptionKey,
)
from onceflow.encryption._keys import KEY_BYTES, KeyRing, parse_key_ring
from onceflow.encryption._settings import DEV_UI_ORIGIN, PayloadEncryptionSettings

__all__ = [
    "CLEAR_TEXT_METADATA",
    "DEV_UI_ORIGIN",
    "ENCRYPTED_ENCODING",
    "KEY_BYTES",
    "KEY_ID_METADATA",
    "ClearText",
    "ClearTextMarkingPayloadConverter",
    "KeyRing",
    "PayloadDecryptionFailed",
    "PayloadEncryptionCodec",
    "PayloadEncryptionSettings",
    "PayloadTampered",
    "UnknownEncryptionKey",
    "is_encrypted",
    "onceflow_data_converter",
    "parse_key_ring",
]
