"""What the OpenAPI document says about requests, and the document's assembly.

The routes read their bodies themselves (``_http_json``), so FastAPI cannot infer them:
each route declares its body here (``model_body``, ``create_task_body``,
``tool_arguments_body``), and ``install_document`` publishes the schemas those refer to,
each tool's arguments among them, with a task's steps and an open task's calls
documented per tool. It then lets ``_openapi.finish_document`` complete the answers. Field
docstrings reach the schemas through pydantic's ``use_attribute_docstrings``, on the
models themselves.
"""

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from onceflow.gateway._http_parameters import BEARER_SCHEME
from onceflow.gateway._openapi import durations_in_seconds, finish_document
from onceflow.gateway._requests import (
    ApproveRequest,
    CallRequest,
    CreateOpenTaskRequest,
    CreateTaskRequest,
    ReconcileRequest,
)
from onceflow.tools.worker import Catalogue
from onceflow.workflows.task_models import NAME_PATTERN


def model_body(model: type[BaseModel]) -> dict[str, Any]:
    """A request body that is ``model``, published under its name."""
    return {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
        },
    }


def create_task_body() -> dict[str, Any]:
    """The body of ``POST /v1/tasks``: a plan or an open task."""
    return {
        "required": True,
        "description": "A plan (`steps`) or an open task (`open`).",
        "content": {
            "application/json": {
                "schema": {
                    "oneOf": [
                        {"$ref": f"#/components/schemas/{model.__name__}"}
                        for model in (CreateTaskRequest, CreateOpenTaskRequest)
                    ]
                }
            }
        },
    }


def tool_arguments_body(catalogue: Catalogue) -> dict[str, Any]:
    """The body of a call of any tool: the arguments of one of ``catalogue``'s tools."""
    return {
        "required": True,
        "description": "The tool's arguments; each tool's schema is listed under its name.",
        "content": {
            "application/json": {
                "schema": {
                    "anyOf": [
                        {"$ref": f"#/components/schemas/{contract.input_model.__name__}"}
                        for contract in catalogue
                    ]
                }
            }
        },
    }


def install_document(app: FastAPI, catalogue: Catalogue) -> None:
    """Serve ``app``'s OpenAPI document with the request schemas of ``catalogue``'s tools,
    built once, on its first request."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _document(app, catalogue)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _document(app: FastAPI, catalogue: Catalogue) -> dict[str, Any]:
    document = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    components = document.setdefault("components", {})
    components["securitySchemes"] = BEARER_SCHEME
    schemas = components.setdefault("schemas", {})
    published: list[type[BaseModel]] = [
        CreateTaskRequest,
        CreateOpenTaskRequest,
        ApproveRequest,
        ReconcileRequest,
        *(contract.input_model for contract in catalogue),
    ]
    for model in published:
        _add_schema(schemas, model)
    schemas["TaskStepRequest"] = _task_step_schema(catalogue)
    schemas["CallRequest"] = _call_schema(catalogue)
    durations_in_seconds(schemas, (model.__name__ for model in published))
    finish_document(document)
    return document


def _add_schema(schemas: dict[str, Any], model: type[BaseModel]) -> None:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, definition in schema.pop("$defs", {}).items():
        schemas.setdefault(name, definition)
    schemas[model.__name__] = schema


def _task_step_schema(catalogue: Catalogue) -> dict[str, Any]:
    """A task step as one variant per tool, so ``arguments`` is documented per tool."""
    return {
        "title": "TaskStepRequest",
        "description": "One step of a task: a tool and its arguments.",
        "oneOf": [
            {
                "type": "object",
                "title": f"{contract.name} step",
                "properties": {
                    "step_id": {"type": "string", "pattern": NAME_PATTERN},
                    "tool": {"type": "string", "const": contract.name},
                    "arguments": {"$ref": f"#/components/schemas/{contract.input_model.__name__}"},
                },
                "required": ["step_id", "tool", "arguments"],
                "additionalProperties": False,
            }
            for contract in catalogue
        ],
    }


def _call_schema(catalogue: Catalogue) -> dict[str, Any]:
    """A call of an open task as one variant per tool, so ``arguments`` is documented per
    tool; the other fields as ``CallRequest`` documents them."""
    fields = CallRequest.model_json_schema()["properties"]
    return {
        "title": "CallRequest",
        "description": CallRequest.__doc__,
        "oneOf": [
            {
                "type": "object",
                "title": f"{contract.name} call",
                "properties": {
                    "call_id": fields["call_id"],
                    "tool": {"type": "string", "const": contract.name},
                    "arguments": {"$ref": f"#/components/schemas/{contract.input_model.__name__}"},
                    "deliberate_repeat": fields["deliberate_repeat"],
                },
                "required": ["tool", "arguments"],
                "additionalProperties": False,
            }
            for contract in catalogue
        ],
    }
