"""Why an encrypted payload could not be decrypted; neither message ever holds key material::

PayloadDecryptionFailed
├── UnknownEncryptionKey   its key id is not among the configured keys
└── PayloadTampered        it does not authenticate under the key its id names
"""

from onceflow.errors import OnceflowError


class PayloadDecryptionFailed(OnceflowError):
    """An encrypted payload this process cannot turn back into the value it holds."""

    status = 422
    code = "payload-not-decodable"
    title = "Payload cannot be decrypted"

    def __init__(self, message: str, *, key_id: str) -> None:
        super().__init__(message)
        self.key_id = key_id
        """The ``encryption-key-id`` the payload names (an id, never the key)."""


class UnknownEncryptionKey(PayloadDecryptionFailed):
    """The payload was encrypted with a key id this process does not hold."""


class PayloadTampered(PayloadDecryptionFailed):
    """The payload does not authenticate: altered, truncated, or another key under its id."""
