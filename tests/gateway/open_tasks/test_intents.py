"""One business intent, one effect, whatever surface asks: the same charge (order,
amount, currency) sent as one-shot calls under new keys through two gateway processes and
the CLI makes one PaymentIntent, and each later call answers with the first; a declared
deliberate repeat makes a second, recorded. Judged by the local Stripe-compatible
provider's ledger and the ``intents`` tables."""

import asyncio
import json
import os
import uuid

import httpx
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.harness import HANG_SECONDS, REPO, eventually, onceflow_command

from ..conftest import Caller, GatewayProcess, Stack, StripeProvider, rows
from .test_http import charge, keyed


async def test_the_same_charge_under_new_keys_on_two_gateways_and_the_cli_charges_once(
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    stripe_provider: StripeProvider,
    stack: Stack,
    database: str,
) -> None:
    order_id = f"ord-{uuid.uuid4().hex[:8]}"
    body = charge(order_id)

    async def call(gateway: GatewayProcess, key: str, query: str = "") -> httpx.Response:
        return await http.post(
            f"{gateway.url}/v1/tools/charge_payment/calls{query}",
            json=body,
            headers=keyed(agent, key),
        )

    first = await call(gateways[0], "model-call-1")
    assert first.status_code == 200, first.text
    [charged] = await stripe_provider.charges(order_id)
    assert first.json()["steps"][0]["resource_id"] == charged.object_id

    # The model repeats the charge under a new key, through the other gateway.
    again = await call(gateways[1], "model-call-2")
    assert again.status_code == 200, again.text
    answered = again.json()["steps"][0]
    assert answered["resource_id"] == charged.object_id
    assert answered["result"]["repeat_of"]["task_id"] == first.json()["task_id"]

    # Another agent process, through the CLI, with a key of its own (run without blocking
    # the event loop: the module's worker runs in it).
    async def cli(key: str, *flags: str) -> str:
        process = await asyncio.create_subprocess_exec(
            *onceflow_command("call", "charge_payment"),
            *("--tenant", agent.principal.tenant, "--key", key),
            *("--args", json.dumps(body), "--wait", *flags),
            cwd=REPO,
            env={**os.environ, **stack.env()},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(process.communicate(), HANG_SECONDS)
        assert process.returncode == 0, output.decode()
        return output.decode()

    assert charged.object_id in await cli("cli-call-1")
    assert [e.object_id for e in await stripe_provider.charges(order_id)] == [charged.object_id]

    # A second identical charge on purpose: made, and recorded as such.
    deliberate = await call(gateways[1], "model-call-3", "?deliberate_repeat=true")
    assert deliberate.status_code == 200, deliberate.text
    charges = [e.object_id for e in await stripe_provider.charges(order_id)]
    assert len(charges) == 2 and deliberate.json()["steps"][0]["resource_id"] in charges
    assert "repeat_of" not in deliberate.json()["steps"][0]["result"]
    # And one more on purpose from the CLI.
    await cli("cli-call-2", "--deliberate-repeat")
    assert len(await stripe_provider.charges(order_id)) == 3
    recorded = rows(
        database,
        "SELECT count(*) FROM intent_deliberate_repeats WHERE tenant = %s",
        agent.principal.tenant,
    )
    assert recorded == [(2,)]
    # One intent row, held by the first call.
    held = rows(
        database,
        "SELECT workflow_id, state, resource_id FROM intents WHERE tenant = %s",
        agent.principal.tenant,
    )
    assert held == [(first.json()["task_id"], "succeeded", charged.object_id)]


ENDED = {"succeeded", "failed"}


async def test_concurrent_identical_intents_under_distinct_keys_over_two_gateways_charge_once(
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    http: httpx.AsyncClient,
    stripe_provider: StripeProvider,
) -> None:
    # Property: however the calls of a few intents interleave over the two gateways, each
    # under a key of its own and all at once, the provider's ledger holds one charge per
    # intent, and every call that ended succeeded answers with its intent's charge.
    loop = asyncio.get_running_loop()
    rounds = 0

    async def ended(answer: httpx.Response) -> dict[str, object]:
        assert answer.status_code in (200, 202), answer.text
        body: dict[str, object] = answer.json()
        if body["state"] in ENDED:
            return body
        task = f"{gateways[0].url}/v1/tasks/{body['task_id']}"
        polled = await eventually(
            lambda: http.get(task, headers=agent.headers),
            until=lambda seen: seen.status_code == 200 and seen.json()["state"] in ENDED,
            what=f"task {body['task_id']} ends",
        )
        return dict(polled.json())

    async def one_round(plan: list[tuple[int, int]]) -> None:
        orders = [f"ord-{uuid.uuid4().hex[:8]}" for _ in range(3)]
        answers = await asyncio.gather(
            *(
                http.post(
                    f"{gateways[gateway].url}/v1/tools/charge_payment/calls",
                    json=charge(orders[intent]),
                    headers=keyed(agent, f"k-{uuid.uuid4().hex[:12]}"),
                )
                for gateway, intent in plan
            )
        )
        bodies = [await ended(answer) for answer in answers]
        for intent in {intent for _, intent in plan}:
            charged = await stripe_provider.charges(orders[intent])
            assert len(charged) == 1, (plan, orders[intent], charged)
            for (_, asked), body in zip(plan, bodies, strict=True):
                if asked == intent and body["state"] == "succeeded":
                    steps = body["steps"]
                    assert isinstance(steps, list)
                    assert steps[0]["resource_id"] == charged[0].object_id

    @settings(
        max_examples=4,
        deadline=None,
        phases=[Phase.generate],
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(plan=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 2)), min_size=2, max_size=8))
    def interleavings(plan: list[tuple[int, int]]) -> None:
        nonlocal rounds
        asyncio.run_coroutine_threadsafe(one_round(plan), loop).result(timeout=HANG_SECONDS)
        rounds += 1

    await asyncio.to_thread(interleavings)
    assert rounds == 4
