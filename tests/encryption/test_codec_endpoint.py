"""The gateway's codec endpoint speaks Temporal's remote codec protocol to operators only.

Over real HTTP to the package's gateway: without credentials it answers 401 and reveals
nothing; an agent's key is refused (403); an operator decodes with a Bearer API key or
with the session cookie that signing in at ``/codec/login`` sets (HttpOnly, Secure,
SameSite=None, never the key itself), which a revoked key ends. Cross-origin, only the
Temporal UI's origin gets CORS headers (preflight included); any other origin is refused
without them, and so is a body not sent as JSON. ``X-Namespace`` must be the gateway's.
"""

import uuid
from http.cookies import SimpleCookie
from typing import Any

import httpx
import psycopg
import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.contrib.pydantic import pydantic_data_converter

from onceflow.encryption import ENCRYPTED_ENCODING, KEY_ID_METADATA
from onceflow.gateway._codec_endpoint import SESSION_COOKIE
from tests.gateway.conftest import Caller, make_caller, new_tenant
from tests.harness import HANG_SECONDS

from .conftest import KEY_ID, UI_ORIGIN, EncryptedStack, readable_text

PROBLEM = "urn:onceflow:problem:"
FOREIGN_ORIGIN = "https://agents.example.net"


@pytest.fixture
async def http(stack: EncryptedStack) -> Any:
    async with httpx.AsyncClient(
        base_url=stack.codec_endpoint + "/", timeout=HANG_SECONDS
    ) as client:
        yield client


@pytest.fixture
async def operator(database: str) -> Caller:
    return await make_caller(database, tenant=new_tenant(), name="ops", may_decide=True)


async def encrypted_body(stack: EncryptedStack, *values: object) -> dict[str, Any]:
    """``{"payloads": [...]}`` as the UI sends it, of values the stack's client encrypted."""
    payloads = await stack.client.data_converter.encode(list(values))
    return json_format.MessageToDict(Payloads(payloads=payloads))


def decoded_values(answer: httpx.Response) -> list[Any]:
    payloads = json_format.ParseDict(answer.json(), Payloads())
    return pydantic_data_converter.payload_converter.from_payloads(list(payloads.payloads))


async def test_only_an_operator_decodes(
    stack: EncryptedStack, http: httpx.AsyncClient, operator: Caller, database: str
) -> None:
    customer = f"cus_{uuid.uuid4().hex[:10]}"
    body = await encrypted_body(stack, {"customer": customer, "amount": 4200})
    agent = await make_caller(database, tenant=operator.principal.tenant, name="agent")

    anonymous = await http.post("decode", json=body)
    assert anonymous.status_code == 401
    assert anonymous.json()["type"] == PROBLEM + "unauthenticated"
    assert "/codec/login" in anonymous.json()["detail"]
    assert customer not in readable_text(anonymous.json())
    unknown_key = await http.post(
        "decode", json=body, headers={"Authorization": "Bearer ofk_not-a-key"}
    )
    assert unknown_key.status_code == 401
    refused = await http.post("decode", json=body, headers=agent.headers)
    assert refused.status_code == 403 and customer not in refused.text
    assert refused.json()["type"] == PROBLEM + "decisions-not-allowed"

    answered = await http.post("decode", json=body, headers=operator.headers)

    assert answered.status_code == 200, answered.text
    assert decoded_values(answered) == [{"customer": customer, "amount": 4200}]


async def test_a_signed_in_operator_decodes_with_the_cookie_until_the_key_is_revoked(
    stack: EncryptedStack, http: httpx.AsyncClient, operator: Caller, database: str
) -> None:
    customer = f"cus_{uuid.uuid4().hex[:10]}"
    body = await encrypted_body(stack, customer)
    page = await http.get("login")
    assert page.status_code == 200 and "name='api_key'" in page.text
    agent = await make_caller(database, tenant=operator.principal.tenant, name="agent")
    not_an_operator = await http.post("login", data={"api_key": agent.api_key})
    assert not_an_operator.status_code == 403 and "set-cookie" not in not_an_operator.headers

    signed_in = await http.post("login", data={"api_key": operator.api_key})

    assert signed_in.status_code == 200, signed_in.text
    assert f"Signed in as {operator.principal.tenant}/ops" in signed_in.text
    [header] = signed_in.headers.get_list("set-cookie")
    cookie = SimpleCookie(header)[SESSION_COOKIE]
    assert cookie["httponly"] and cookie["secure"] and cookie["samesite"] == "none"
    assert cookie["path"] == "/codec" and cookie["max-age"] == str(8 * 3600)
    assert operator.api_key not in header
    session = {"Cookie": f"{SESSION_COOKIE}={cookie.value}"}
    answered = await http.post("decode", json=body, headers=session)
    assert answered.status_code == 200, answered.text
    assert decoded_values(answered) == [customer]
    forged = {"Cookie": f"{SESSION_COOKIE}={cookie.value[:-3]}AAA"}
    assert (await http.post("decode", json=body, headers=forged)).status_code == 401

    async with await psycopg.AsyncConnection.connect(database, autocommit=True) as conn:
        await conn.execute(
            "UPDATE api_keys SET revoked_at = now() WHERE principal_id = %s",
            (operator.principal.principal_id,),
        )
    revoked = await http.post("decode", json=body, headers=session)
    assert revoked.status_code == 401 and customer not in revoked.text
    signed_out = await http.post("logout")
    assert SimpleCookie(signed_out.headers["set-cookie"])[SESSION_COOKIE]["max-age"] == "0"


async def test_cors_answers_the_temporal_ui_origin_only(
    stack: EncryptedStack, http: httpx.AsyncClient, operator: Caller
) -> None:
    customer = f"cus_{uuid.uuid4().hex[:10]}"
    body = await encrypted_body(stack, customer)
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,x-namespace",
    }

    allowed = await http.options("decode", headers={"Origin": UI_ORIGIN, **preflight})
    assert allowed.status_code == 204
    assert allowed.headers["access-control-allow-origin"] == UI_ORIGIN
    assert allowed.headers["access-control-allow-credentials"] == "true"
    assert "X-Namespace" in allowed.headers["access-control-allow-headers"]
    assert "POST" in allowed.headers["access-control-allow-methods"]
    foreign = await http.options("decode", headers={"Origin": FOREIGN_ORIGIN, **preflight})
    assert foreign.status_code == 403
    assert "access-control-allow-origin" not in foreign.headers

    from_ui = {"Origin": UI_ORIGIN, "X-Namespace": stack.client.namespace}
    answered = await http.post("decode", json=body, headers={**from_ui, **operator.headers})
    assert answered.status_code == 200 and decoded_values(answered) == [customer]
    assert answered.headers["access-control-allow-origin"] == UI_ORIGIN
    assert answered.headers["access-control-allow-credentials"] == "true"
    # The UI sees a refusal as one (and then shows the payloads still encrypted).
    anonymous = await http.post("decode", json=body, headers=from_ui)
    assert anonymous.status_code == 401
    assert anonymous.headers["access-control-allow-origin"] == UI_ORIGIN

    elsewhere = await http.post(
        "decode", json=body, headers={"Origin": FOREIGN_ORIGIN, **operator.headers}
    )
    assert elsewhere.status_code == 403 and customer not in elsewhere.text
    assert "access-control-allow-origin" not in elsewhere.headers
    # A "simple" cross-site request (no preflight) is refused before anything is read.
    simple = await http.post(
        "decode",
        content=httpx.Request("POST", "/", json=body).content,
        headers={"Content-Type": "text/plain", **operator.headers},
    )
    assert simple.status_code == 415 and customer not in simple.text


async def test_namespace_encode_and_undecodable_payloads(
    stack: EncryptedStack, http: httpx.AsyncClient, operator: Caller
) -> None:
    customer = f"cus_{uuid.uuid4().hex[:10]}"
    body = await encrypted_body(stack, customer)
    other = await http.post(
        "decode", json=body, headers={"X-Namespace": "someone-else", **operator.headers}
    )
    assert other.status_code == 400 and customer not in other.text

    plain = json_format.MessageToDict(
        Payloads(payloads=await pydantic_data_converter.encode([customer]))
    )
    encoded = await http.post("encode", json=plain, headers=operator.headers)
    assert encoded.status_code == 200, encoded.text
    [sealed] = json_format.ParseDict(encoded.json(), Payloads()).payloads
    assert sealed.metadata["encoding"] == ENCRYPTED_ENCODING
    assert sealed.metadata[KEY_ID_METADATA] == KEY_ID.encode()
    assert await stack.client.data_converter.decode([sealed], [str]) == [customer]
    # A payload that was never encrypted comes back as it was.
    unchanged = await http.post("decode", json=plain, headers=operator.headers)
    assert unchanged.json() == plain

    [stored] = json_format.ParseDict(body, Payloads()).payloads
    relabelled = Payload()
    relabelled.CopyFrom(stored)
    relabelled.metadata[KEY_ID_METADATA] = b"k-retired"
    unknown = await http.post(
        "decode",
        json=json_format.MessageToDict(Payloads(payloads=[relabelled])),
        headers=operator.headers,
    )
    assert unknown.status_code == 422
    assert unknown.json()["type"] == PROBLEM + "payload-not-decodable"
    assert unknown.json()["key_id"] == "k-retired"
    tampered = Payload()
    tampered.CopyFrom(stored)
    tampered.data = stored.data[:-1] + bytes([stored.data[-1] ^ 1])
    refused = await http.post(
        "decode",
        json=json_format.MessageToDict(Payloads(payloads=[tampered])),
        headers=operator.headers,
    )
    assert refused.status_code == 422 and customer not in refused.text
