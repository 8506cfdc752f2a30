"""An operator finds a parked task in the Temporal Web UI and reads what to do about it.

Headless Chromium from the distribution's package (``/usr/bin/chromium``, installed by
``.ci/run``), driven by Playwright with that executable: nothing is downloaded. The UI
is the dev server's own (the one ``onceflow dev`` serves on :8233); the task comes in
through the gateway and parks for real.
"""

import os
import shutil
import uuid
from pathlib import Path
from urllib.parse import quote

import httpx
from onceflow_devstack.stripe_provider import Fault
from playwright.async_api import async_playwright, expect

from onceflow.telemetry import PARKED_QUERY
from onceflow.workflows.task_models import ReconcileDecision, ReconcileInput, TaskState
from tests.payments.conftest import FAST_BUDGET, VISA_CHARGE

from .conftest import TelemetryStack

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "operate-parked-task.png"
"""The pictures of docs/operate.md (this one and ``operate-parked-filter.png``), written
when missing or when ``ONCEFLOW_SCREENSHOTS=update``; otherwise only under the test's
temporary folder, so a test run leaves the work tree as it was."""
BROWSER_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
BROWSER_WAIT_MS = 60_000
"""How long a page may take to show what an assertion waits for: a safety net only (each
wait ends when the element shows); Chromium renders slowly on a busy single core."""
expect.set_options(timeout=BROWSER_WAIT_MS)


async def test_an_operator_finds_a_parked_task_and_its_evidence_in_the_web_ui(
    stack: TelemetryStack, http: httpx.AsyncClient, temporal_ui_port: int, tmp_path: Path
) -> None:
    assert CHROMIUM.exists(), "install Debian's Chromium first (apt-get install chromium)"
    tenant, auth = await stack.new_agent(tools=("charge_payment",))
    await stack.control.configure(search_lag_seconds=3600)
    await stack.control.add_fault(
        Fault.ERROR_500_AFTER_COMMIT, path_prefix="/v1/payment_intents", times=None
    )
    await stack.control.add_fault(
        Fault.ERROR_503, method="GET", path_prefix="/v1/payment_intents", times=None
    )
    try:
        answer = await http.post(
            f"{stack.gateway_url}/v1/tasks",
            json={
                "steps": [{"step_id": "pay", "tool": "charge_payment", "arguments": VISA_CHARGE}],
                "budget": FAST_BUDGET.model_dump(mode="json"),
            },
            headers={**auth, "Idempotency-Key": uuid.uuid4().hex},
        )
        task_id = answer.json()["task_id"]
        await stack.wait_for_state(task_id, lambda s: s.state is TaskState.PARKED)
    finally:
        await stack.control.clear_faults()
        await stack.control.configure(search_lag_seconds=0)

    ui = f"http://127.0.0.1:{temporal_ui_port}/namespaces/{stack.client.namespace}"
    query = f"{PARKED_QUERY} AND OnceflowTenant = '{tenant}'"
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=BROWSER_ARGS, headless=True
        )
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(BROWSER_WAIT_MS)
            # The list, filtered by the state search attribute (as a bookmarked query).
            await page.goto(f"{ui}/workflows?query={quote(query)}")
            link = page.get_by_role("link", name=task_id)
            await expect(link).to_be_visible()
            await expect(page.get_by_text('OnceflowState = "parked"')).to_be_visible()
            await expect(page.get_by_role("link", name=f"{tenant}:")).to_have_count(1)
            await page.screenshot(path=str(tmp_path / "filter.png"))

            # The task: its summary, and as current details the evidence and the command.
            await link.click()
            await page.wait_for_url("**/timeline")
            metadata_tab = page.get_by_role("tab", name="User Metadata")
            await metadata_tab.click()
            await expect(metadata_tab).to_have_attribute("aria-selected", "true")
            # The UI renders each markdown field in its own frame: summary, details, current.
            summary, static_details, current = (
                page.locator("iframe").nth(index).content_frame for index in range(3)
            )
            await expect(summary.get_by_text(f"{tenant}: charge_payment")).to_be_visible()
            await expect(static_details.get_by_text("Trace:")).to_be_visible()
            await expect(
                current.get_by_text("Parked at step pay (charge_payment): Stripe answered HTTP 500")
            ).to_be_visible()
            await expect(current.get_by_text("- child_key_digest: sha256:")).to_be_visible()
            await expect(current.get_by_text("- request_id: req_")).to_be_visible()
            await expect(current.get_by_text(f"onceflow reconcile {task_id}")).to_be_visible()
            await page.screenshot(path=str(tmp_path / "task.png"))
        finally:
            await browser.close()
    for name in ("task", "filter"):
        published = SCREENSHOT.with_name(f"operate-parked-{name}.png")
        if not published.exists() or os.environ.get("ONCEFLOW_SCREENSHOTS") == "update":
            published.parent.mkdir(exist_ok=True)
            shutil.copy(tmp_path / f"{name}.png", published)

    await stack.tasks.reconcile(
        task_id,
        ReconcileInput(
            step_id="pay",
            decision=ReconcileDecision.ABANDON,
            operator="ops",
            reason="seen in the UI test",
        ),
    )
