"""Every command scrubs what onceflow's tool families declare secret, not only the
commands that serve their tools: ``onceflow relay`` and the short commands (``status``,
``parked``, ``reconcile``...) never load the payment tools, yet a Stripe key in one of
their log lines must not be printed."""

import subprocess
import sys

PROBE = """
from onceflow.cli._configuration import loaded_configuration
from onceflow.telemetry import scrub

line = "provider said: invalid key sk_live_abcdefghij1234567890"
print(scrub(line))
loaded_configuration()
print(scrub(line))
"""


def test_a_command_that_serves_no_payment_tool_still_scrubs_stripe_keys() -> None:
    # A fresh process, as each command is: nothing loaded before the configuration.
    printed = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "ONCEFLOW_BUILTIN_TOOLS": "issue_coupon"},
    ).stdout.splitlines()

    # Before the configuration is loaded only the generic rules hold (the control).
    assert printed == [
        "provider said: invalid key sk_live_abcdefghij1234567890",
        "provider said: invalid key [secret removed]",
    ]
