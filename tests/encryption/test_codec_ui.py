"""An operator reads an encrypted task's input in the Temporal Web UI, through the codec endpoint.

The dev server is started the way ``onceflow dev`` starts it with payload keys configured
(``TemporalDevServer(codec_endpoint=...)``: ``--ui-codec-endpoint`` pointing at the
gateway's ``/codec``), with its own encrypting worker and gateway. Headless Chromium from
the distribution (``/usr/bin/chromium``, nothing downloaded) plays the operator: before
signing in, the input shows encrypted, also once the UI's codec settings include
cross-origin credentials (the endpoint answers 401); after signing in at
``/codec/login`` with an operator's API key, the same page shows the customer's id.
"""

import socket
import uuid
from pathlib import Path

from onceflow_devstack.temporal import TemporalDevServer
from playwright.async_api import Locator, Page, async_playwright, expect

from tests.gateway.conftest import make_caller, new_tenant
from tests.telemetry.test_operate_ui import BROWSER_ARGS, BROWSER_WAIT_MS, CHROMIUM

from .conftest import encrypted_stack, encryption_settings, order_task


async def test_the_web_ui_shows_the_input_decrypted_to_a_signed_in_operator_only(
    postgres_url: str, database: str, tmp_path: Path
) -> None:
    assert CHROMIUM.exists(), "install Debian's Chromium first (apt-get install chromium)"
    temporal_port, ui_port, gateway_port = _free_ports(3)
    ui = f"http://127.0.0.1:{ui_port}"
    codec_endpoint = f"http://127.0.0.1:{gateway_port}/codec"
    temporal = TemporalDevServer(
        tmp_path / "temporal", port=temporal_port, ui_port=ui_port, codec_endpoint=codec_endpoint
    )
    await temporal.start()
    try:
        async with encrypted_stack(
            postgres_url,
            temporal.endpoints.address,
            encryption_settings(ui_origin=ui),
            gateway_port=gateway_port,
        ) as stack:
            tenant = new_tenant()
            operator = await make_caller(database, tenant=tenant, name="ops", may_decide=True)
            customer_id = f"ann.lee.{uuid.uuid4().hex[:8]}"
            task_id = await order_task(stack, customer_id, tenant=tenant, prefix="ui")
            task_page = f"{ui}/namespaces/{stack.client.namespace}/workflows/{task_id}"

            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(
                    executable_path=str(CHROMIUM), args=BROWSER_ARGS, headless=True
                )
                try:
                    page = await browser.new_page(viewport={"width": 1400, "height": 1000})
                    page.set_default_timeout(BROWSER_WAIT_MS)
                    # As the dev server configures it: the endpoint, no credentials sent.
                    await _open_and_see_the_codec_answer(page, task_page, status=401)
                    await expect(_codec_failure_banner(page)).to_be_visible()
                    await expect(page.get_by_text(customer_id)).to_have_count(0)

                    # The operator's browser setting: the same endpoint, with credentials.
                    await _include_credentials(page, codec_endpoint)
                    await _open_and_see_the_codec_answer(page, task_page, status=401)
                    await expect(page.get_by_text(customer_id)).to_have_count(0)

                    await page.goto(f"{codec_endpoint}/login")
                    await page.get_by_label("API key").fill(operator.api_key)
                    await page.get_by_role("button", name="Sign in").click()
                    await expect(page.get_by_text(f"Signed in as {tenant}/ops")).to_be_visible()

                    await _open_and_see_the_codec_answer(page, task_page, status=200)
                    await expect(
                        page.get_by_text(f'"customer_id": "{customer_id}"').first
                    ).to_be_visible()
                    await expect(_codec_failure_banner(page)).to_have_count(0)
                finally:
                    await browser.close()
    finally:
        temporal.stop()


async def _open_and_see_the_codec_answer(page: Page, url: str, *, status: int) -> None:
    """Open ``url`` and wait until the UI's first decode request is answered with ``status``."""
    async with page.expect_response(
        lambda response: "/codec/decode" in response.url and response.request.method == "POST",
        timeout=BROWSER_WAIT_MS,
    ) as answer:
        await page.goto(url)
    assert (await answer.value).status == status
    # The attempt's summary is clear text: readable with or without the codec endpoint.
    await expect(page.get_by_text("create_order · step order · attempt 1").first).to_be_visible()


async def _include_credentials(page: Page, codec_endpoint: str) -> None:
    """In the UI's Codec Server settings: this browser's endpoint, credentials included."""
    await page.get_by_role("button", name="Codec Server could not connect").click()
    await page.get_by_text("Use my browser setting and ignore Cluster-level setting.").click()
    await page.get_by_label("Codec Server browser endpoint").fill(codec_endpoint)
    await page.get_by_text("Include cross-origin credentials").click()
    await page.get_by_role("button", name="Apply").click()


def _codec_failure_banner(page: Page) -> Locator:
    return page.locator("#content").get_by_text("Codec Server could not connect")


def _free_ports(count: int) -> list[int]:
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()
