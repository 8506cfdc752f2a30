"""Tools for the registration tests: one sound tool and one per mistake an author can make.

Each is importable by path (``tests.tools.sample_tools:NAME``), the way
``ONCEFLOW_TOOLS`` names a tool.
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

import httpx
from pydantic import BaseModel, Field
from pydantic_settings import SettingsConfigDict

from onceflow.settings import FileBackedSettings
from onceflow.tools import (
    DedupeStrategy,
    EffectFlags,
    OutcomeClass,
    Tool,
    ToolAttemptResult,
    ToolCall,
    ToolContract,
)


class NoteSettings(FileBackedSettings):
    """The sample tool's own settings, as a tool author declares them."""

    config_table = "tools.write_note"
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_NOTES_", extra="ignore")

    shelf: int = Field(default=1, ge=1)
    """Where notes go. Default 1."""


class Note(BaseModel):
    text: str
    amount: int = 0


async def write_note(call: ToolCall[Note]) -> ToolAttemptResult:
    operation = await call.begin("write", provider_account="notes")
    if operation.earlier_success:
        return operation.earlier_success
    await operation.record(request_id=f"req-{call.attempt}")
    return await operation.succeeded(f"note-{call.step_id}", {"text": call.args.text})


def write_note_synchronously(call: ToolCall[Note]) -> ToolAttemptResult:
    return ToolAttemptResult(outcome=OutcomeClass.SUCCEEDED)


CONTRACT = ToolContract(
    name="write_note",
    description="Write a note.",
    input_model=Note,
    effects=EffectFlags(idempotent=True, open_world=False),
    dedupe=DedupeStrategy.LOCAL_TRANSACTION,
    start_to_close_timeout=timedelta(seconds=5),
)
SOUND = Tool(contract=CONTRACT, perform=write_note)

NO_TIMEOUT = Tool(contract=replace(CONTRACT, start_to_close_timeout=None), perform=write_note)
IDEMPOTENT_WITHOUT_STRATEGY = Tool(
    contract=replace(CONTRACT, dedupe=DedupeStrategy.NONE), perform=write_note
)
SYNCHRONOUS = Tool(contract=CONTRACT, perform=write_note_synchronously)  # type: ignore[arg-type]
NOT_A_TOOL = CONTRACT


@asynccontextmanager
async def open_retrying_client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(retries=3)) as client:
        yield client


@asynccontextmanager
async def open_plain_client() -> AsyncIterator[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=5) as client:
        yield {"notes": client}


RETRYING_CLIENT = Tool(contract=CONTRACT, perform=write_note, open_client=open_retrying_client)
PLAIN_CLIENT = Tool(contract=CONTRACT, perform=write_note, open_client=open_plain_client)


def all_sound_tools() -> list[Tool]:
    """A factory, as an entry point may name one."""
    return [SOUND]
