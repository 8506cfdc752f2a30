"""The codec endpoint: operators read encrypted task payloads in the Temporal UI and CLI.

Temporal's remote codec protocol, served by the gateway under ``/codec`` once payload
encryption is configured (``ONCEFLOW_PAYLOAD_KEYS``): ``POST /codec/decode`` and
``POST /codec/encode`` take and answer ``{"payloads": [...]}``, Temporal payloads in
protobuf JSON. The Temporal UI's *Codec Server* setting (or ``--ui-codec-endpoint``) and
the CLI's ``--codec-endpoint`` point at ``<gateway>/codec``. The gateway already holds
the keys, the principals and a database pool, so operators run nothing more.

Only operators read payloads: a principal permitted to decide tasks (``onceflow principal
add --decisions``), never an agent. A request authenticates with

- ``Authorization: Bearer <API key>`` (``temporal workflow show --codec-auth "Bearer …"``),
- or the session cookie a browser gets by signing in once at ``GET /codec/login`` with an
  operator's API key: HttpOnly, ``Secure``, ``SameSite=None``, ``Path=/codec``. It holds a
  signed session (the key's digest and an expiry, HMAC'd with a secret derived from the
  payload keys), never the key itself, and revoking the key ends it. The UI sends it once
  its codec settings *include cross-origin credentials*.

Anything else is 401, and the UI then shows the payloads still encrypted. ``X-Namespace``,
when sent, must name the namespace the gateway's tasks live in.

Cross-origin, only the Temporal UI (``ONCEFLOW_UI_ORIGIN``) is answered: its preflights
and requests get ``Access-Control-Allow-Origin`` with that origin and
``Access-Control-Allow-Credentials: true``; a preflight or request from any other origin
is refused (403) and gets no CORS header, and a body not sent as JSON is refused (415)
before anything is read, so no page elsewhere can have a browser send a signed-in
operator's request.
"""

import base64
import binascii
import hmac
import html
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

import psycopg
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from google.protobuf import json_format
from psycopg_pool import PoolTimeout
from temporalio.api.common.v1 import Payload, Payloads

from onceflow.encryption import (
    KeyRing,
    PayloadDecryptionFailed,
    PayloadEncryptionCodec,
    PayloadEncryptionSettings,
    UnknownEncryptionKey,
)
from onceflow.errors import (
    BackendUnavailable,
    DecisionsNotAllowed,
    InvalidRequest,
    OnceflowError,
    OriginNotAllowed,
    PayloadNotDecodable,
    RequestTooLarge,
    Unauthenticated,
    UnsupportedMediaType,
)
from onceflow.gateway._principals import Principal, PrincipalStore, api_key_digest

CODEC_PATH = "/codec"
"""Where the codec endpoint is served: the UI's and CLI's codec endpoint is the gateway's
URL plus this."""
SESSION_COOKIE = "onceflow_codec_session"
"""The cookie of a signed-in operator's session."""
MAX_CODEC_BODY_BYTES = 8 * 1024 * 1024
"""Largest body read: the UI sends an event's payloads at once (each up to Temporal's 2 MiB)."""
_MAX_LOGIN_BODY_BYTES = 4096
_ALLOWED_HEADERS = "Content-Type, X-Namespace, Authorization, Authorization-Extras"
_PREFLIGHT_MAX_AGE_SECONDS = 600
_SESSION_VERSION = "v1"


class CodecSessions:
    """Signed, expiring codec sessions: the API key's digest, the expiry, an HMAC.

    Signed under the encrypting key's derived secret and checked under the secret of the
    key id the session names, so every gateway holding the keys accepts every session,
    and a session outlives a rotation as long as its key stays in the ring.
    """

    def __init__(self, keys: KeyRing, *, lifetime: timedelta) -> None:
        self._keys = keys
        self._lifetime = lifetime

    @property
    def lifetime(self) -> timedelta:
        """How long a session lasts."""
        return self._lifetime

    def issue(self, api_key: str, *, now: datetime) -> str:
        """A session for the principal of ``api_key``, from ``now``."""
        key_id = self._keys.encrypting_key_id
        expires = int((now + self._lifetime).timestamp())
        body = "|".join((_SESSION_VERSION, key_id, str(expires), api_key_digest(api_key)))
        mac = self._keys.session_mac(key_id, body.encode())
        return f"{_b64(body.encode())}.{_b64(mac)}"

    def key_digest(self, token: str, *, now: datetime) -> str | None:
        """The API key digest of a valid, unexpired session; None for anything else."""
        encoded_body, _, encoded_mac = token.partition(".")
        try:
            body = _unb64(encoded_body).decode()
            mac = _unb64(encoded_mac)
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
        parts = body.split("|")
        if len(parts) != 4 or parts[0] != _SESSION_VERSION or not parts[2].isdigit():
            return None
        _, key_id, expires, key_digest = parts
        try:
            expected = self._keys.session_mac(key_id, body.encode())
        except UnknownEncryptionKey:
            return None
        if not hmac.compare_digest(mac, expected) or int(expires) <= now.timestamp():
            return None
        return key_digest


def install_codec_endpoint(
    app: FastAPI,
    encryption: PayloadEncryptionSettings,
    *,
    principals: Callable[[Request], PrincipalStore],
    namespace: Callable[[Request], str],
    problem: Callable[[OnceflowError], Response],
) -> None:
    """Add the codec endpoint's routes (outside the OpenAPI document) to ``app``.

    Args:
        app: The gateway's app.
        encryption: The settings holding the keys and the UI's origin.
        principals: The principal store of the request's boundary service.
        namespace: The Temporal namespace of the request's boundary service.
        problem: How the app answers a ``OnceflowError``.
    """
    keys = encryption.key_ring()
    if keys is None:
        raise ValueError("the codec endpoint needs payload keys (ONCEFLOW_PAYLOAD_KEYS)")
    codec = PayloadEncryptionCodec(keys)
    sessions = CodecSessions(keys, lifetime=timedelta(hours=encryption.codec_session_hours))
    ui_origin = encryption.ui_origin

    def with_cors(request: Request, response: Response) -> Response:
        if request.headers.get("origin") == ui_origin:
            response.headers["Access-Control-Allow-Origin"] = ui_origin
            response.headers["Access-Control-Allow-Credentials"] = "true"
        response.headers["Vary"] = "Origin"
        return response

    async def operator(request: Request) -> Principal:
        store = principals(request)
        authorization = request.headers.get("authorization")
        if authorization is not None:
            scheme, _, credentials = authorization.strip().partition(" ")
            if scheme.lower() != "bearer" or not credentials.strip():
                raise Unauthenticated("send 'Authorization: Bearer <API key>'")
            principal = await store.authenticate(credentials.strip())
        else:
            token = request.cookies.get(SESSION_COOKIE)
            digest = sessions.key_digest(token, now=datetime.now(UTC)) if token else None
            if digest is None:
                raise Unauthenticated(
                    f"sign in at {_root(request)}{CODEC_PATH}/login with an operator's API key "
                    "(or send 'Authorization: Bearer <API key>')"
                )
            principal = await store.authenticate_digest(digest)
        return _an_operator(principal)

    async def convert(
        request: Request, transform: Callable[[Sequence[Payload]], Awaitable[list[Payload]]]
    ) -> Response:
        try:
            _refuse_foreign_origin(request, ui_origin)
            _refuse_non_json(request)
            await operator(request)
            sent_namespace = request.headers.get("x-namespace")
            if sent_namespace is not None and sent_namespace != namespace(request):
                raise InvalidRequest(
                    f"this codec endpoint serves namespace {namespace(request)!r} only; the "
                    "X-Namespace header names another"
                )
            payloads = await _read_payloads(request)
            converted = await transform(payloads)
        except (psycopg.OperationalError, PoolTimeout):
            return with_cors(
                request, problem(BackendUnavailable("the database is unreachable; retry"))
            )
        except OnceflowError as refused:
            return with_cors(request, problem(refused))
        body = json_format.MessageToDict(Payloads(payloads=converted))
        return with_cors(request, JSONResponse(body, headers={"Cache-Control": "no-store"}))

    async def decrypt(payloads: Sequence[Payload]) -> list[Payload]:
        try:
            return await codec.decode(payloads)
        except PayloadDecryptionFailed as failed:
            raise PayloadNotDecodable(str(failed), key_id=failed.key_id) from None

    @app.options(f"{CODEC_PATH}/{{operation}}", include_in_schema=False)
    async def codec_preflight(request: Request, operation: str) -> Response:
        if request.headers.get("origin") != ui_origin:
            refused = OriginNotAllowed(
                "the codec endpoint answers the Temporal UI's origin only (ONCEFLOW_UI_ORIGIN)"
            )
            return with_cors(request, problem(refused))
        allowed = {
            "Access-Control-Allow-Methods": "POST",
            "Access-Control-Allow-Headers": _ALLOWED_HEADERS,
            "Access-Control-Max-Age": str(_PREFLIGHT_MAX_AGE_SECONDS),
        }
        return with_cors(request, Response(status_code=204, headers=allowed))

    @app.post(f"{CODEC_PATH}/decode", include_in_schema=False)
    async def codec_decode(request: Request) -> Response:
        return await convert(request, decrypt)

    @app.post(f"{CODEC_PATH}/encode", include_in_schema=False)
    async def codec_encode(request: Request) -> Response:
        return await convert(request, codec.encode)

    @app.get(f"{CODEC_PATH}/login", include_in_schema=False)
    async def codec_login_page(request: Request) -> Response:
        return _page(_login_form(request), status=200)

    @app.post(f"{CODEC_PATH}/login", include_in_schema=False)
    async def codec_login(request: Request) -> Response:
        try:
            _refuse_foreign_origin(request, ui_origin)
            api_key = await _form_api_key(request)
            principal = _an_operator(await principals(request).authenticate(api_key))
        except OnceflowError as refused:
            return _page(
                f"<p role='alert'>{html.escape(refused.detail)}</p>{_login_form(request)}",
                status=refused.status,
            )
        now = datetime.now(UTC)
        response = _page(_signed_in(principal, now + sessions.lifetime, ui_origin), status=200)
        response.set_cookie(
            SESSION_COOKIE,
            sessions.issue(api_key, now=now),
            max_age=int(sessions.lifetime.total_seconds()),
            path=f"{_root(request)}{CODEC_PATH}",
            secure=True,
            httponly=True,
            samesite="none",
        )
        return response

    @app.post(f"{CODEC_PATH}/logout", include_in_schema=False)
    async def codec_logout(request: Request) -> Response:
        response = _page(f"<p>Signed out.</p>{_login_form(request)}", status=200)
        response.delete_cookie(
            SESSION_COOKIE,
            path=f"{_root(request)}{CODEC_PATH}",
            secure=True,
            httponly=True,
            samesite="none",
        )
        return response


def _an_operator(principal: Principal) -> Principal:
    if not principal.may_decide:
        raise DecisionsNotAllowed(
            "task payloads are for operators: this principal may not decide tasks "
            "(`onceflow principal add --decisions`)"
        )
    return principal


def _refuse_foreign_origin(request: Request, ui_origin: str) -> None:
    """A browser's request from an origin other than the UI's or the gateway's own."""
    origin = request.headers.get("origin")
    if origin is None or origin == ui_origin:
        return
    if urlsplit(origin).netloc and urlsplit(origin).netloc == request.headers.get("host"):
        return  # the login page's own form
    raise OriginNotAllowed(
        "the codec endpoint answers the Temporal UI's origin only (ONCEFLOW_UI_ORIGIN)"
    )


def _refuse_non_json(request: Request) -> None:
    declared = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if declared != "application/json":
        raise UnsupportedMediaType("send the payloads as JSON (Content-Type: application/json)")


async def _read_body(request: Request, limit: int) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestTooLarge(f"the body is larger than {limit} bytes")
    return bytes(body)


async def _read_payloads(request: Request) -> list[Payload]:
    body = await _read_body(request, MAX_CODEC_BODY_BYTES)
    try:
        payloads = json_format.Parse(body, Payloads(), ignore_unknown_fields=True)
    except (json_format.ParseError, UnicodeDecodeError):
        raise InvalidRequest(
            'the body is not {"payloads": [...]} of Temporal payloads in protobuf JSON'
        ) from None
    return list(payloads.payloads)


async def _form_api_key(request: Request) -> str:
    declared = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if declared != "application/x-www-form-urlencoded":
        raise UnsupportedMediaType("sign in with the form at this address")
    body = await _read_body(request, _MAX_LOGIN_BODY_BYTES)
    try:
        fields = parse_qs(body.decode(), max_num_fields=4)
    except (UnicodeDecodeError, ValueError):
        raise InvalidRequest("sign in with the form at this address") from None
    api_key = (fields.get("api_key") or [""])[0].strip()
    if not api_key:
        raise Unauthenticated("enter an operator's API key")
    return api_key


def _root(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def _login_form(request: Request) -> str:
    action = html.escape(f"{_root(request)}{CODEC_PATH}/login")
    return (
        "<h1>onceflow codec endpoint</h1>"
        "<p>Sign in with an operator's API key (a principal that may decide tasks) to read "
        "encrypted task payloads in the Temporal UI.</p>"
        f"<form method='post' action='{action}'>"
        "<label>API key <input type='password' name='api_key' autocomplete='off' required>"
        "</label> <button type='submit'>Sign in</button></form>"
    )


def _signed_in(principal: Principal, until: datetime, ui_origin: str) -> str:
    who = html.escape(f"{principal.tenant}/{principal.name}")
    return (
        f"<h1>Signed in as {who}</h1>"
        f"<p>Until {until:%Y-%m-%d %H:%M} UTC. In the Temporal UI, open the codec server "
        "settings, point them at this endpoint and turn on <em>Include cross-origin "
        "credentials</em>; payloads then show decrypted.</p>"
        f"<p><a href='{html.escape(ui_origin)}'>Back to the Temporal UI</a></p>"
    )


def _page(body: str, *, status: int) -> HTMLResponse:
    document = (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<title>onceflow codec endpoint</title></head>"
        f"<body style='font-family: sans-serif; max-width: 40rem; margin: 2rem auto'>{body}"
        "</body></html>"
    )
    return HTMLResponse(
        document,
        status_code=status,
        headers={
            "Cache-Control": "no-store",
            "X-Frame-Options": "DENY",
            "Content-Security-Policy": (
                "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                "frame-ancestors 'none'"
            ),
        },
    )


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
