"""``PayloadEncryptionSettings``: the ``[payload_encryption]`` table, read by every process
that talks to Temporal (worker, gateway, MCP server, CLI, dev stack)."""

from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from onceflow.encryption._keys import KEY_ID, KeyRing, parse_key_ring
from onceflow.settings import FileBackedSettings

DEV_UI_ORIGIN = "http://localhost:8233"
"""The Temporal UI of ``onceflow dev`` (and of ``temporal server start-dev``)."""


class PayloadEncryptionSettings(FileBackedSettings):
    """Encryption of task payloads at rest in Temporal, and the codec endpoint that lets
    operators read them in the Temporal UI (``[payload_encryption]``). Off until
    ``ONCEFLOW_PAYLOAD_KEYS`` holds a key."""

    config_table = "payload_encryption"
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_", extra="ignore", frozen=True)

    payload_keys: Annotated[tuple[SecretStr, ...], NoDecode] = ()
    """AES-256 keys as ``key_id:base64key`` (``ONCEFLOW_PAYLOAD_KEYS``, comma-separated;
    ``payload_keys = [...]`` in the file). Default none: payloads are stored unencrypted.
    The first encrypts (unless ``ONCEFLOW_PAYLOAD_KEY_ID`` names another); all decrypt.
    To rotate, put the new key first and keep the old ones while histories need them.
    Every worker, gateway, MCP server and CLI of a deployment needs the same keys."""
    payload_key_id: str | None = None
    """The id of the key new payloads are encrypted with (``ONCEFLOW_PAYLOAD_KEY_ID``).
    Default: the first key of ``ONCEFLOW_PAYLOAD_KEYS``."""
    ui_origin: str = DEV_UI_ORIGIN
    """The Temporal UI's origin (``ONCEFLOW_UI_ORIGIN``, ``scheme://host[:port]``): the one
    origin the codec endpoint answers cross-origin requests from. Default
    ``http://localhost:8233`` (``onceflow dev`` uses its own UI's)."""
    codec_session_hours: float = Field(default=8.0, gt=0, le=720)
    """How long a sign-in at the codec endpoint lasts (``ONCEFLOW_CODEC_SESSION_HOURS``).
    Default 8."""

    @field_validator("payload_keys", mode="before")
    @classmethod
    def _split_comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str | SecretStr):
            text = value.get_secret_value() if isinstance(value, SecretStr) else value
            return tuple(part.strip() for part in text.split(",") if part.strip())
        return value

    @field_validator("payload_keys")
    @classmethod
    def _well_formed_keys(cls, value: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        if value:
            parse_key_ring([entry.get_secret_value() for entry in value])
        return value

    @field_validator("payload_key_id")
    @classmethod
    def _named_key_is_configured(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if not KEY_ID.fullmatch(value):
            raise ValueError("a key id holds letters, digits and . _ - (64 at most)")
        keys = info.data.get("payload_keys")
        if keys is None:  # the keys themselves are invalid: reported on their own
            return value
        ids = [entry.get_secret_value().partition(":")[0].strip() for entry in keys]
        if value not in ids:
            raise ValueError(
                f"key id {value!r} is not among ONCEFLOW_PAYLOAD_KEYS"
                + (f" ({', '.join(ids)})" if ids else " (none configured)")
            )
        return value

    @field_validator("ui_origin")
    @classmethod
    def _an_origin(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
            or parts.username
        ):
            raise ValueError("an origin is scheme://host[:port], e.g. https://temporal.example.com")
        return f"{parts.scheme}://{parts.netloc.lower()}"

    @property
    def enabled(self) -> bool:
        """Whether payloads are encrypted (at least one key is configured)."""
        return bool(self.payload_keys)

    def key_ring(self) -> KeyRing | None:
        """The configured keys, or None when encryption is off."""
        if not self.payload_keys:
            return None
        return parse_key_ring(
            [entry.get_secret_value() for entry in self.payload_keys],
            encrypting_key_id=self.payload_key_id,
        )
