"""Which settings hold secrets, so that nothing prints their values."""

import re
import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import SecretBytes, SecretStr
from pydantic.fields import FieldInfo

_SECRET_WORDS = ("secret", "password", "passwd", "token")
_URL_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:/@]*):[^@/]*@")


def is_secret_setting(name: str, field: FieldInfo) -> bool:
    """Whether a field holds a secret whose value is never shown: typed ``SecretStr`` (or
    ``SecretBytes``), or named like one (``…key``, ``…secret…``, ``…password…``, ``…token…``).

    Only a trailing ``key`` counts, so ``key_retention`` or ``default_key_quota`` are shown.
    """
    lowered = name.lower()
    return (
        _holds_secret_type(field.annotation)
        or lowered.endswith("key")
        or any(word in lowered for word in _SECRET_WORDS)
    )


def mask_url_password(value: str) -> str:
    """``scheme://user:***@host…`` for a URL that carries a password; other text unchanged."""
    return _URL_PASSWORD.sub(r"\1:***@", value)


def _holds_secret_type(annotation: Any) -> bool:
    if annotation in (SecretStr, SecretBytes):
        return True
    if get_origin(annotation) in (Union, types.UnionType, Annotated):
        return any(_holds_secret_type(argument) for argument in get_args(annotation))
    return False
