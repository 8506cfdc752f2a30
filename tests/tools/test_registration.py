"""Registration refuses every mistake a tool author can make, each with a fix."""

import json
import os
import subprocess
import sys
from contextlib import AsyncExitStack
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
import requests
import stripe
from requests.adapters import HTTPAdapter

from onceflow.configuration import load_configuration
from onceflow.settings import InvalidSettings, ProcessSettings
from onceflow.tools import (
    ApprovalThreshold,
    DedupeStrategy,
    EffectFlags,
    Tool,
    ToolRegistrationError,
)
from onceflow.tools.worker import (
    Catalogue,
    client_retry_problems,
    load_configured_tools,
    load_tools,
    open_tool_client,
    register_tools,
)
from tests.tools import sample_tools

SAMPLES = "tests.tools.sample_tools"


def refusal(spec: str) -> str:
    with pytest.raises(ToolRegistrationError) as refused:
        load_tools([spec], ProcessSettings())
    return str(refused.value)


def test_a_tool_without_an_attempt_timeout_is_refused() -> None:
    message = refusal(f"{SAMPLES}:NO_TIMEOUT")
    assert "tool 'write_note' is refused" in message
    assert "no start_to_close_timeout" in message
    assert "fix: set start_to_close_timeout=timedelta(seconds=…)" in message


def test_an_idempotent_claim_without_a_dedupe_strategy_is_refused() -> None:
    message = refusal(f"{SAMPLES}:IDEMPOTENT_WITHOUT_STRATEGY")
    assert "claims to be idempotent but names no dedupe strategy" in message
    assert "fix: name the mechanism that dedupes a repeat" in message


async def test_a_client_that_retries_on_its_own_is_refused_when_the_worker_opens_it() -> None:
    async with AsyncExitStack() as clients:
        with pytest.raises(ToolRegistrationError) as refused:
            await open_tool_client(sample_tools.RETRYING_CLIENT, clients)
    assert "retries on its own (transport retries=3)" in str(refused.value)
    assert "fix: build its transport with retries=0" in str(refused.value)


async def test_a_client_without_retries_is_opened_and_handed_to_the_tool() -> None:
    async with AsyncExitStack() as clients:
        client = await open_tool_client(sample_tools.PLAIN_CLIENT, clients)
        assert isinstance(client["notes"], httpx.AsyncClient)
    assert client["notes"].is_closed  # closed with the worker


def test_retrying_clients_are_seen_inside_containers_and_in_every_visible_library() -> None:
    session = requests.Session()
    session.mount("https://", HTTPAdapter(max_retries=3))
    quiet = requests.Session()
    stripe_default = stripe.StripeClient("sk_test_x")  # inherits stripe's global retries
    stripe_quiet = stripe.StripeClient("sk_test_x", max_network_retries=0)
    retrying = httpx.Client(transport=httpx.HTTPTransport(retries=2))

    assert client_retry_problems({"desk": retrying})[0][0].startswith("its client 'desk'")
    assert "max_retries=3" in client_retry_problems(session)[0][0]
    assert "max_network_retries=2" in client_retry_problems(stripe_default)[0][0]
    assert client_retry_problems((quiet, stripe_quiet, httpx.Client())) == []


def test_every_other_mistake_is_named_with_its_fix_all_at_once() -> None:
    contract = replace(
        sample_tools.CONTRACT,
        name="Write Note",
        description=" ",
        start_to_close_timeout=timedelta(seconds=5),
        heartbeat_timeout=timedelta(seconds=5),
        effects=EffectFlags(read_only=True, destructive=True, idempotent=True),
        dedupe=DedupeStrategy.PROVIDER_IDEMPOTENCY_KEY,
        approval_threshold=ApprovalThreshold(argument="amonut", above=Decimal(10)),
        lookup_activity="look_up_somewhere",
        provider_settle_time=timedelta(seconds=-1),
    )
    with pytest.raises(ToolRegistrationError) as refused:
        Catalogue().register(contract)
    message = str(refused.value)
    for problem in (
        "is not a lower-case identifier",
        "the description is empty",
        "heartbeat_timeout 0:00:05 is not shorter than start_to_close_timeout",
        "marked both read_only and destructive",
        "does not say how long the provider remembers keys",
        "approval_threshold but requires_approval is False",
        "provider_settle_time (-1 s) is negative",
    ):
        assert problem in message
    assert message.count("; fix: ") == 7

    threshold_on_a_missing_field = replace(
        sample_tools.CONTRACT,
        requires_approval=True,
        approval_threshold=ApprovalThreshold(argument="amonut", above=Decimal(10)),
    )
    with pytest.raises(ToolRegistrationError, match="'amonut', which is not an input field"):
        Catalogue().register(threshold_on_a_missing_field)

    no_look_up = Tool(contract=contract, perform=sample_tools.write_note)
    assert "the tool has no look_up" in refusal_of(no_look_up)


def refusal_of(tool: Tool) -> str:
    from onceflow.tools._tool import tool_problems

    return "; ".join(what for what, _ in tool_problems(tool))


def test_implementation_mistakes_are_refused() -> None:
    assert "perform is not an async function" in refusal(f"{SAMPLES}:SYNCHRONOUS")
    assert "not an onceflow.tools.Tool" in refusal(f"{SAMPLES}:NOT_A_TOOL")


def test_a_setting_that_names_nothing_loadable_says_how_to_fix_it() -> None:
    assert "no installed package declares an 'onceflow.tools' entry point" in refusal("nosuch")
    assert "cannot import 'nosuch_package.tools'" in refusal("nosuch_package.tools:TOOL")
    assert f"module {SAMPLES!r} has no 'MISSING'" in refusal(f"{SAMPLES}:MISSING")
    assert "write it as package.module:ATTRIBUTE" in refusal(":TOOL")


def test_configured_tools_are_registered_once_and_a_taken_name_is_refused() -> None:
    catalogue = Catalogue()
    loaded = load_configured_tools([f"{SAMPLES}:all_sound_tools"], ProcessSettings(), catalogue)
    # The same tool again: a no-op.
    load_configured_tools([f"{SAMPLES}:SOUND"], ProcessSettings(), catalogue)
    assert [tool.name for tool in loaded] == ["write_note"]
    assert catalogue.get("write_note") == sample_tools.CONTRACT

    impostor = Tool(
        contract=replace(sample_tools.CONTRACT, description="Another tool."),
        perform=sample_tools.write_note,
    )
    with pytest.raises(ToolRegistrationError, match="already registered"):
        register_tools([impostor], catalogue)


def test_the_worker_refuses_to_start_with_an_unsafe_tool_in_its_configuration() -> None:
    env = {
        **os.environ,
        "ONCEFLOW_TOOLS": f"{SAMPLES}:NO_TIMEOUT",
        # Never reached: the tools are checked before any connection is made.
        "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
        "TEMPORAL_ADDRESS": "127.0.0.1:1",
    }
    finished = subprocess.run(
        [sys.executable, "-m", "onceflow.cli", "worker"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert finished.returncode == 2
    assert "tool 'write_note' is refused" in finished.stderr
    assert "no start_to_close_timeout" in finished.stderr
    assert "Traceback" not in finished.stderr


def test_onceflow_tools_lists_a_configured_tool_beside_the_reference_tools() -> None:
    env = {**os.environ, "ONCEFLOW_TOOLS": f"{SAMPLES}:SOUND"}
    listed = subprocess.run(
        [sys.executable, "-m", "onceflow.cli", "tools", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    by_name = {tool["tool"]: tool for tool in json.loads(listed.stdout)}
    assert by_name["write_note"]["source"] == "custom"
    assert by_name["write_note"]["dedupe"] == "local_transaction"
    assert by_name["charge_payment"]["source"] == "reference"


def test_a_custom_tools_own_settings_are_checked_with_the_rest_at_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "onceflow.toml"
    config.write_text(f'[onceflow]\ntools = ["{SAMPLES}:SOUND"]\n[tools.write_note]\nshelf = 0\n')
    monkeypatch.setenv("ONCEFLOW_CONFIG", str(config))
    with pytest.raises(InvalidSettings) as refused:
        load_configuration()
    assert refused.value.problems == (
        f"invalid setting ONCEFLOW_NOTES_SHELF ([tools.write_note] shelf in {config}): "
        "Input should be greater than or equal to 1; fix: set a value the message allows, "
        "or remove it to use the default 1",
    )
