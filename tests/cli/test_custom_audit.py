"""An audit is a tool-API capability: a user's family that declares one
(``ToolFamily.open_auditor``) is audited by ``onceflow audit`` like onceflow's payments."""

import json
import os
import subprocess
import sys

from tests.harness import REPO


def onceflow_audit(
    database: str, *arguments: str, **settings: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onceflow.cli", "audit", "--since", "1h", *arguments],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={
            **os.environ,
            "DATABASE_URL": database,
            "ONCEFLOW_TOOLS": "tests.cli.audit_family:ledger_family",
            **settings,
        },
    )


def test_a_custom_familys_audit_runs_through_the_command(database: str) -> None:
    found = onceflow_audit(database, "--family", "ledger", "--json", LEDGER_EFFECTS="lp_1,lp_2")
    assert found.returncode == 6, found.stderr
    report = json.loads(found.stdout)
    assert report["family"] == "ledger"
    assert [f["resource_ids"] for f in report["findings"]] == [["lp_1"], ["lp_2"]]
    assert report["counts"] == {"duplicate": 0, "orphan": 2, "missing": 0}

    clean = onceflow_audit(database, "--family", "ledger", "--json", LEDGER_EFFECTS="")
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout)["clean"] is True


def test_a_family_that_offers_no_audit_is_refused_naming_those_that_do(database: str) -> None:
    refused = onceflow_audit(database, "--family", "coupons")
    assert refused.returncode == 2
    assert "no tool family named 'coupons' offers an audit" in refused.stderr
    assert "ledger, payments" in refused.stderr
