"""A user's tool family gets every start-up check, redaction rule and client check that
onceflow's own families get, through the same route (``onceflow.tools.worker.load_families``).

``desk_family`` below is a user's family as an ``ONCEFLOW_TOOLS`` import path names it:
it needs ``DESK_TOKEN`` to start, its tokens must never reach a log, a span or a task's
history, and its client library retries unless told not to. Each test holds it beside
the payment family, which declares the same three things about Stripe.
"""

import os
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest
import stripe
from pydantic import SecretStr
from pydantic_settings import SettingsConfigDict

from onceflow.activities import builtin_families, configured_families, startup_problems
from onceflow.payments import StripeSettings
from onceflow.settings import (
    BUILTIN_TOOL_NAMES,
    FileBackedSettings,
    OnceflowSettings,
    ProcessSettings,
    SettingsSource,
)
from onceflow.telemetry import scrub, sensitive_locations
from onceflow.tools import (
    ClientRetryCheck,
    Redaction,
    StartupProblem,
    ToolFamily,
    ToolRegistrationError,
)
from onceflow.tools import _family as tools_family
from onceflow.tools.worker import client_retry_problems, load_families, loaded_families
from tests.tool_configuration import configuration
from tests.tools import sample_tools

FAMILY = f"{__name__}:desk_family"
DESK_TOKEN = "dsk_live_4eC39HqLyjWDarjtT1zdp7dc"
STRIPE_KEY = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"


class DeskSettings(FileBackedSettings):
    """The desk family's settings (``DESK_*``, or ``[tools.desk]``)."""

    config_table = "tools.desk"
    model_config = SettingsConfigDict(env_prefix="DESK_", extra="ignore", frozen=True)

    token: SecretStr | None = None
    """The desk's API token (``DESK_TOKEN``). Default: none."""


class DeskSession:
    """A client of a library onceflow does not know, retrying on its own by default."""

    __module__ = "deskclient.session"

    def __init__(self, retries: int = 2) -> None:
        self.retries = retries


def desk_retries(client: Any) -> str | None:
    retries = getattr(client, "retries", 0)
    return f"retries={retries}" if retries else None


def desk_family(settings: SettingsSource) -> ToolFamily:
    desk = settings.read(DeskSettings)
    tool = replace(sample_tools.SOUND, contract=replace(sample_tools.CONTRACT, name="desk_note"))
    missing = StartupProblem(
        tools=("desk_note",), problem="DESK_TOKEN is not set", fix="set it to your desk token"
    )
    return ToolFamily(
        name="desk",
        tools=(tool,),
        problems=() if desk.token else (missing,),
        redactions=(Redaction(what="desk token", pattern=r"dsk_(?:live|test)_[A-Za-z0-9]{12,}+"),),
        client_checks=(
            ClientRetryCheck(
                module="deskclient", retries=desk_retries, fix="open the session with retries=0"
            ),
        ),
    )


def test_a_served_familys_missing_service_is_one_line_with_its_fix_like_the_payment_familys() -> (
    None
):
    loaded = configuration(
        onceflow=OnceflowSettings(tools=(FAMILY,), builtin_tools=("issue_coupon", "charge_payment"))
    )
    families = configured_families(loaded)

    problems = startup_problems(loaded, families)

    assert problems == [
        "STRIPE_API_KEY is not set, but this worker serves charge_payment; fix: set it to your "
        "Stripe secret key (and STRIPE_API_BASE only to point elsewhere), or leave it out: "
        "ONCEFLOW_BUILTIN_TOOLS=issue_coupon",
        "DESK_TOKEN is not set, but this worker serves desk_note; fix: set it to your desk "
        "token, or leave the family out: ONCEFLOW_TOOLS=",
    ]
    # Given their services, neither family has a problem left.
    supplied = loaded.with_sections(
        DeskSettings(token=SecretStr("dsk_test_0000000000000")), StripeSettings(api_key=STRIPE_KEY)
    )
    assert startup_problems(supplied, configured_families(supplied)) == []


def test_a_worker_refuses_to_start_while_a_served_family_lacks_its_service(
    postgres_url: str,
) -> None:
    env = {
        **os.environ,
        "ONCEFLOW_TOOLS": FAMILY,
        "ONCEFLOW_BUILTIN_TOOLS": "issue_coupon,charge_payment",
        "STRIPE_API_KEY": "",
        "DATABASE_URL": postgres_url,
        # Never reached: the services are checked before Temporal is.
        "TEMPORAL_ADDRESS": "127.0.0.1:1",
    }
    env.pop("DESK_TOKEN", None)
    finished = subprocess.run(
        [sys.executable, "-m", "onceflow.cli", "worker"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert finished.returncode == 2, finished.stderr
    lines = finished.stderr.strip().splitlines()
    assert len(lines) == 2, finished.stderr  # one per missing service, nothing else
    assert "STRIPE_API_KEY is not set, but this worker serves charge_payment" in lines[0]
    assert "DESK_TOKEN is not set, but this worker serves desk_note" in lines[1]
    assert "fix: set it to your desk token, or leave the family out" in lines[1]
    assert "Traceback" not in finished.stderr


def test_a_loaded_familys_redaction_is_scrubbed_and_refused_like_a_stripe_key() -> None:
    [desk] = load_families([FAMILY], ProcessSettings())
    load_families(["onceflow.payments:payment_family"], configuration())
    assert desk in loaded_families()

    line = f"desk answered for token {DESK_TOKEN}; stripe for key {STRIPE_KEY}"
    assert scrub(line) == (
        "desk answered for token [secret removed]; stripe for key [secret removed]"
    )
    findings = sensitive_locations({"note": DESK_TOKEN, "key": STRIPE_KEY})
    assert [(finding.location, finding.detail) for finding in findings] == [
        (["note"], "desk token"),
        (["key"], "Stripe secret key"),
    ]
    # Matched where a token starts, as onceflow's own rules are: not inside a word.
    assert scrub(f"x{DESK_TOKEN}") == f"x{DESK_TOKEN}"


def test_a_family_loaded_after_a_scan_is_scrubbed_and_refused_from_then_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The families' pattern is kept between scans: a family loaded later still counts."""
    [desk] = load_families([FAMILY], ProcessSettings())
    ledger_key = "ldg_k3Jf9sLq2Wz8Xv"
    line = f"ledger key {ledger_key}"
    assert scrub(line) == line
    assert sensitive_locations({"key": ledger_key}) == []
    later = replace(
        desk,
        name="ledger",
        redactions=(Redaction(what="ledger key", pattern=r"ldg_[A-Za-z0-9]{12,}+"),),
    )
    # What ``remember_family`` does, undone after the test.
    monkeypatch.setitem(tools_family._LOADED, later.name, later)
    assert scrub(line) == "ledger key [secret removed]"
    assert [finding.detail for finding in sensitive_locations({"key": ledger_key})] == [
        "ledger key"
    ]


def test_a_loaded_familys_client_check_refuses_a_retrying_client_like_a_stripe_clients() -> None:
    load_families([FAMILY], ProcessSettings())
    load_families(["onceflow.payments:payment_family"], configuration())

    [(desk, desk_fix)] = client_retry_problems({"desk": DeskSession()})
    [(stripe_client, stripe_fix)] = client_retry_problems(stripe.StripeClient("sk_test_x"))

    assert desk == "its client 'desk' (DeskSession) retries on its own (retries=2)"
    assert desk_fix == "open the session with retries=0"
    assert "max_network_retries=2" in stripe_client
    assert stripe_fix == "build the StripeClient with max_network_retries=0"
    assert client_retry_problems({"desk": DeskSession(retries=0)}) == []


BROKEN = ToolFamily(
    name="broken",
    tools=(sample_tools.SOUND,),
    problems=(StartupProblem(tools=("charge_payment",), problem="X is not set", fix="set X"),),
    redactions=(Redaction(what="anything", pattern=r"(unclosed"),),
)


def test_a_family_with_a_broken_declaration_is_refused_with_the_fix() -> None:
    with pytest.raises(ToolRegistrationError) as refused:
        load_families([f"{__name__}:BROKEN"], ProcessSettings())
    message = str(refused.value)
    assert "tool family 'broken' is refused" in message
    assert "names charge_payment, not one of its tools" in message
    assert "redaction 'anything' is not a regular expression" in message
    assert "broken" not in {family.name for family in loaded_families()}


def test_onceflows_own_families_bring_the_built_in_tools_in_catalogue_order() -> None:
    families = builtin_families(configuration())

    assert [family.name for family in families] == [
        "coupons",
        "orders",
        "payments",
        "email",
        "deployments",
    ]
    assert [tool.name for family in families for tool in family.tools] == list(BUILTIN_TOOL_NAMES)
    narrowed = builtin_families(
        configuration(onceflow=OnceflowSettings(builtin_tools=("send_email",)))
    )
    assert [tool.name for family in narrowed for tool in family.tools] == ["send_email"]
    assert {family.name for family in loaded_families()} >= {"payments", "deployments"}
