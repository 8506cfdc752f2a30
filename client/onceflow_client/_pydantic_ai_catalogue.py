"""onceflow's catalogue as a PydanticAI toolset's tools: what both PydanticAI toolsets
(``pydantic_ai.OnceflowToolset``, calling the gateway, and
``pydantic_ai_temporal.OnceflowNexusToolset``, calling over Nexus) offer the model. How a
call is made is each toolset's own ``call_tool``."""

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.tools import AgentDepsT, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
from pydantic_core import SchemaValidator, core_schema

METADATA_KEY = "onceflow"
"""Where a tool's onceflow annotations sit in its ``ToolDefinition.metadata``, and a deferred
call's details in ``DeferredToolRequests.metadata[tool_call_id]``."""

_ANY_ARGUMENTS = SchemaValidator(core_schema.any_schema())
"""onceflow validates the arguments against the tool's input model and refuses a bad call
before anything is recorded; a second, local copy of that check could only disagree."""


class CatalogueToolset(AbstractToolset[AgentDepsT]):
    """The tools of a catalogue (as ``OnceflowClient.list_tools`` returns them: ``name``,
    ``description``, ``input_schema``, ``annotations``), under the toolset's ``id``."""

    def __init__(
        self, catalogue: Sequence[Mapping[str, Any]], *, id: str | None, max_retries: int
    ) -> None:
        self._id = id
        self._max_retries = max_retries
        self._definitions = {
            str(tool["name"]): ToolDefinition(
                name=str(tool["name"]),
                description=str(tool.get("description") or ""),
                parameters_json_schema=dict(tool.get("input_schema") or {"type": "object"}),
                metadata={METADATA_KEY: dict(tool.get("annotations") or {})},
            )
            for tool in catalogue
        }

    @property
    def id(self) -> str | None:
        return self._id

    async def get_tools(self, ctx: RunContext[AgentDepsT]) -> dict[str, ToolsetTool[AgentDepsT]]:
        return {
            name: ToolsetTool(
                toolset=self,
                tool_def=definition,
                max_retries=self._max_retries,
                args_validator=_ANY_ARGUMENTS,
            )
            for name, definition in self._definitions.items()
        }
