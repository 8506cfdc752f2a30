"""The data converter of every onceflow client and worker, encrypting when keys are configured.

Without keys it is ``temporalio.contrib.pydantic.pydantic_data_converter`` itself. With
keys it is the same pydantic converter plus ``PayloadEncryptionCodec``, and failures keep
their message and stack trace among their encoded (so encrypted) attributes: an
activity's failure message may quote what the far side said about a customer.

What Temporal stores, with keys configured:

- encrypted: workflow, activity, update, signal and query inputs and results (task
  arguments, results, evidence, decisions), the task's status, the UI's *current details*
  (they list a parked step's evidence), failure messages, stack traces and details;
- readable: search attributes (Temporal never runs them through a codec), and what
  onceflow composes for operators from identifiers alone and marks ``ClearText``: the
  task's summary (tenant, tools) and details (principal, trace id), each attempt's and
  timer's summary (tool, step id, attempt), and the memo (``trace_id``, the request
  fingerprint, a digest).
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import DataConverter, DefaultFailureConverterWithEncodedAttributes

from onceflow.encryption._codec import CLEAR_TEXT_METADATA, PayloadEncryptionCodec
from onceflow.encryption._settings import PayloadEncryptionSettings


class ClearText(str):
    """Text onceflow composes for operators from identifiers only (a summary, details, a
    memo value), stored unencrypted so the Temporal UI shows it without the codec endpoint.

    Never wrap a tool's arguments, a result, evidence or anything a caller sent in it.
    """

    __slots__ = ()


class ClearTextMarkingPayloadConverter(PydanticPayloadConverter):
    """The pydantic payload converter, marking each ``ClearText`` value's payload so that
    ``PayloadEncryptionCodec`` leaves it unencrypted."""

    def to_payloads(self, values: Sequence[Any]) -> list[Payload]:
        """See ``PayloadConverter.to_payloads``."""
        payloads = super().to_payloads(values)
        for value, payload in zip(values, payloads, strict=True):
            if isinstance(value, ClearText):
                payload.metadata[CLEAR_TEXT_METADATA] = b"true"
        return payloads


def onceflow_data_converter(encryption: PayloadEncryptionSettings | None = None) -> DataConverter:
    """The data converter for ``encryption``: the pydantic one, encrypting when it holds keys.

    Args:
        encryption: The ``[payload_encryption]`` settings; None or no keys: no encryption.
    """
    keys = encryption.key_ring() if encryption is not None else None
    if keys is None:
        return pydantic_data_converter
    return dataclasses.replace(
        pydantic_data_converter,
        payload_converter_class=ClearTextMarkingPayloadConverter,
        payload_codec=PayloadEncryptionCodec(keys),
        failure_converter_class=DefaultFailureConverterWithEncodedAttributes,
    )
