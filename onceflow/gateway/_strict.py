"""Validation at the boundary: a request's JSON types must be the ones its schema says.

pydantic's default (lax) mode turns ``"1"`` and ``true`` into ``1`` where a field is an
integer, ``1`` into ``true`` where it is a boolean, ``1.0`` into ``1``: a request the
published schema calls invalid would run, and its fingerprint would equal that of the
request it was coerced into. The boundary validates in strict JSON mode instead, where
JSON's own forms of the other types are still taken (an ISO 8601 string for a duration or
a date, a string for an enum). The one lax form kept is a duration sent as a number of
seconds, which the request models document and the Python client sends.

Only the boundary is strict: what it accepted is passed on as validated JSON, which the
workflow and the activities validate again in the models' ordinary mode.
"""

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails

Model = TypeVar("Model", bound=BaseModel)

_DURATION_TYPE_ERROR = "time_delta_type"


def validate_strictly(model: type[Model], data: Any) -> Model:
    """``data`` (parsed JSON) as ``model``, without coercing one JSON type into another.

    Data that is not JSON (an in-process caller's Python objects) is validated in the
    model's ordinary mode: only what came over the wire has JSON types to keep.

    Raises:
        ValidationError: The data does not validate, or validates only by coercion.
    """
    try:
        text = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError):
        return model.model_validate(data)
    try:
        return model.model_validate_json(text, strict=True)
    except ValidationError as invalid:
        errors = invalid.errors()
        refused = [error for error in errors if not _seconds_as_duration(error)]
        if len(refused) == len(errors):
            raise
        if refused:
            raise _without_durations(invalid, refused) from None
    # Only durations given in seconds stood in the way: the documented lax form.
    return model.model_validate(data)


def _without_durations(invalid: ValidationError, refused: list[Any]) -> ValidationError:
    """``invalid`` less its errors about durations given in seconds."""
    details = [
        InitErrorDetails(type=error["type"], loc=error["loc"], input=error["input"])
        for error in refused
    ]
    for detail, error in zip(details, refused, strict=True):
        if "ctx" in error:
            detail["ctx"] = error["ctx"]
    try:
        return ValidationError.from_exception_data(invalid.title, details)
    except (KeyError, TypeError, ValueError):
        # A model's own error type cannot be rebuilt: report every error as found.
        return invalid


def _seconds_as_duration(error: Any) -> bool:
    value = error["input"]
    return (
        error["type"] == _DURATION_TYPE_ERROR
        and isinstance(value, int | float)
        and not isinstance(value, bool)
    )
