"""A storm of repeats answered before routing: ASGI middleware that answers a tool call
whose exact bytes were vouched for under its key (``AnswerCache``) from memory.

A storm (every replica of an agent retrying one call) is the gateway's most frequent
request and the one whose answer never changes. The tool route would answer it the same
way after FastAPI matched the route, solved its parameters and entered its exception
handling; here the request meets the same checks in the same order (the API key, the
tool allowed, one well-formed key, a JSON body of a size the gateway reads) and, when
its bytes were vouched for, the stored answer, without those layers. Anything else, a
refusal included, goes on to the route as it came, its body replayed: the route refuses
exactly as it always does. The request's server span (FastAPI's telemetry, outside this
middleware) and its ``tools.call`` span are made as for any call.

Only the named tool routes without a query: a repeat of a deliberate repeat, or of a call
to the generic route, takes the route.
"""

import hashlib
from collections import deque
from collections.abc import Iterable

from opentelemetry import trace
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from onceflow.errors import OnceflowError
from onceflow.gateway._http_answers import answer_response
from onceflow.gateway._http_json import read_body, sent_key
from onceflow.gateway._http_parameters import api_key, service_of


def tool_call_path(tool: str) -> str:
    """The documented route of a call to ``tool``."""
    return f"/v1/tools/{tool}/calls"


def request_digest(tool: str, deliberate_repeat: bool, body: bytes) -> str:
    """What a tool call is, byte for byte: the tool, the query that changes its
    fingerprint and the body as sent. A storm of retries repeats it exactly."""
    return hashlib.sha256(f"{tool}\n{deliberate_repeat}\n".encode() + body).hexdigest()


class VouchedRepeats:
    """Answers the vouched repeats of calls to ``tools`` before the app routes them."""

    def __init__(self, app: ASGIApp, *, tools: Iterable[str]) -> None:
        self.app = app
        self._tools = {tool_call_path(tool): tool for tool in tools}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tool = (
            self._tools.get(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST" and not scope["query_string"]
            else None
        )
        if tool is None:
            await self.app(scope, receive, send)
            return
        received = _Recording(receive)
        request = Request(scope, received.receive)
        service = service_of(request)
        if not service.remembers_answers():
            # Nothing is answered from memory now: checking here would only check twice
            # (and authenticate twice from the tables while the principal cache is deaf).
            await self.app(scope, receive, send)
            return
        try:
            principal = await service.authenticate(api_key(request))
            service.check_tool(principal, tool)
            key = sent_key(request)
            if key:
                body = await read_body(request)
                answer = service.repeated_tool_call(
                    principal, tool, key, request_digest(tool, False, body)
                )
                if answer is not None:
                    trace.get_current_span().set_attribute("http.route", scope["path"])
                    await answer_response(answer)(scope, receive, send)
                    return
        except (OnceflowError, ClientDisconnect):
            pass  # the route meets it again and answers it as it answers any such request
        await self.app(scope, received.replay(), send)


class _Recording:
    """A request's ``receive`` that remembers what it handed out, so the route can be
    handed the same messages again (``replay``) after the middleware read the body."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._received: list[Message] = []

    async def receive(self) -> Message:
        message = await self._receive()
        self._received.append(message)
        return message

    def replay(self) -> Receive:
        pending = deque(self._received)

        async def receive() -> Message:
            return pending.popleft() if pending else await self._receive()

        return receive
