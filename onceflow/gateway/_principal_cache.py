"""Authenticated principals kept in memory, exact through PostgreSQL notifications.

Every request is authenticated; reading ``principals`` and ``api_keys`` for each one
costs a database round trip on the hot path. A gateway instead remembers the principal
of each API key it has seen, and forgets them all as soon as any principal or key
changes: triggers on both tables ``NOTIFY onceflow_principals`` (migration 11), and one
connection per gateway ``LISTEN``\\s for it. Revoking a key in one place therefore takes
effect in every gateway at once:

* a notification is read the moment its bytes reach the gateway (a socket reader), and
  again before answering from memory (once per turn of the event loop: ``_catch_up``),
  so a request that arrives after the revoking transaction committed is not answered
  from a principal read before it;
* while the listening connection is down (PostgreSQL restarted, the connection killed),
  nothing is answered from memory: every request reads the tables, as without the cache,
  until the connection is back and has forgotten everything;
* a principal is read again at least every ``REMEMBERED_FOR`` seconds, so even a
  notification channel that stopped without a sign stays bounded;
* a read that raced a change is not remembered (a generation counter).

Unknown keys are never remembered: a wrong key always reads the tables.

The same connection also hears every prune pass that deleted idempotency records
(``PRUNED_CHANNEL``), and what it has heard (``heard``) is what the gateway's answer
cache (``_answer_cache``) forgets its answers by: a principal's change or a prune forgets
them all, and nothing is answered from memory while nothing is heard.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import psycopg
from psycopg.rows import TupleRow

from onceflow.gateway._principals import Principal
from onceflow.idempotency import PRUNED_RECORDS_CHANNEL

log = logging.getLogger("onceflow.gateway")

CHANNEL = "onceflow_principals"
"""The notification channel the principals' and API keys' triggers notify."""
PRUNED_CHANNEL = PRUNED_RECORDS_CHANNEL
"""The channel a prune pass notifies once it deleted records (``IdempotencyStore.prune``):
remembered answers of pruned records must go. Forgetting the principals with them costs
one read per API key after an (hourly) prune."""
REMEMBERED_FOR = 30.0
"""Seconds a remembered principal is trusted without a notification (the bound when the
channel fails silently)."""
RECONNECT_PAUSE = 1.0
"""Seconds before the first attempt to listen again after the connection was lost; each
failed attempt doubles the pause, up to ``RECONNECT_PAUSE_MAX``."""
RECONNECT_PAUSE_MAX = 5.0
"""The longest pause between attempts to listen again: attempts never stop."""
LISTEN_TIMEOUT = 10.0
"""Seconds one attempt to connect and ``LISTEN`` may take: an attempt that hangs (a
server that accepts and never answers) must not end the attempts."""
APPLICATION_NAME = "onceflow-principal-changes"
"""How the listening connection names itself in ``pg_stat_activity``."""


@dataclass(frozen=True)
class _Remembered:
    principal: Principal
    until: float


class PrincipalCache:
    """The principals of the API keys this gateway has seen, while it listens."""

    def __init__(self, database_url: str) -> None:
        self._database_url = database_url
        self._remembered: dict[str, _Remembered] = {}
        self._generation = 0
        self._connection: psycopg.AsyncConnection[TupleRow] | None = None
        self._socket = -1
        self._hearing = False
        self._lost = asyncio.Event()
        self._caught_up = False

    @property
    def listening(self) -> bool:
        """Whether changes are heard now (only then is anything answered from memory)."""
        return self._hearing

    @property
    def generation(self) -> int:
        """Counts the times everything was forgotten; read it before a database read."""
        return self._generation

    def principal(self, key_hash: str) -> Principal | None:
        """The remembered principal of a key digest, or None (then read the tables)."""
        self._catch_up()
        if not self.listening:
            return None
        remembered = self._remembered.get(key_hash)
        if remembered is None or remembered.until < time.monotonic():
            return None
        return remembered.principal

    def heard(self) -> int | None:
        """The generation of everything heard so far, once what the server has sent is
        read; None while nothing is heard (then nothing may be answered from memory)."""
        self._catch_up()
        return self._generation if self._hearing else None

    def remember(self, key_hash: str, principal: Principal, *, read_in: int) -> None:
        """Remember what a read begun in generation ``read_in`` found, unless something
        changed meanwhile (or nothing is heard now)."""
        if self.listening and read_in == self._generation:
            self._remembered[key_hash] = _Remembered(principal, time.monotonic() + REMEMBERED_FOR)

    async def keep_listening(self) -> None:
        """Listen, and listen again whenever the connection is lost, for as long as it
        runs (until cancelled): attempts go on with a capped backoff, never give up."""
        pause = RECONNECT_PAUSE
        lost_since: float | None = None
        while True:
            try:
                async with asyncio.timeout(LISTEN_TIMEOUT):
                    await self._listen()
                if lost_since is not None:
                    log.warning(
                        "principal changes: listening again, %.1f s after the connection was lost",
                        time.monotonic() - lost_since,
                    )
                    lost_since = None
                pause = RECONNECT_PAUSE
                await self._lost.wait()
            except Exception as error:
                # Never the end of listening: without it nothing is remembered, which is
                # slower, never wrong.
                log.warning("principal changes: cannot listen (%s)", type(error).__name__)
            finally:
                await self._stop_listening()
            if lost_since is None:
                lost_since = time.monotonic()
            await asyncio.sleep(pause)
            pause = min(pause * 2, RECONNECT_PAUSE_MAX)

    async def _listen(self) -> None:
        connection = await psycopg.AsyncConnection.connect(
            self._database_url,
            autocommit=True,
            connect_timeout=5,
            application_name=APPLICATION_NAME,
        )
        try:
            await connection.execute(f"LISTEN {CHANNEL}")
            await connection.execute(f"LISTEN {PRUNED_CHANNEL}")
        except BaseException:
            await connection.close()
            raise
        self._lost.clear()
        self._forget_all()
        self._connection, self._hearing = connection, True
        self._socket = connection.pgconn.socket
        asyncio.get_running_loop().add_reader(self._socket, self._read_notifications)

    async def _stop_listening(self) -> None:
        connection, self._connection, self._hearing = self._connection, None, False
        self._forget_all()
        if connection is None:
            return
        self._stop_reading()
        with contextlib.suppress(psycopg.Error, OSError):
            await connection.close()

    def _stop_reading(self) -> None:
        if self._socket >= 0:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self._socket)
            self._socket = -1

    def _catch_up(self) -> None:
        """Read what the server has sent, before an answer from memory: once per turn of
        the event loop, which is a syscall less for each further look in the turn (a
        repeat asks for its principal, then for its answer). A request is handled in a
        turn after the one that read its bytes, so what came before the request is read
        in its own turn; what comes later in that turn came after the request."""
        if self._caught_up:
            return
        self._caught_up = True
        asyncio.get_running_loop().call_soon(self._next_turn)
        self._read_notifications()

    def _next_turn(self) -> None:
        self._caught_up = False

    def _read_notifications(self) -> None:
        """Take whatever the server has sent the listening connection, without waiting:
        any notification forgets everything; a broken connection stops answering from
        memory until it is back."""
        connection = self._connection
        if connection is None or not self._hearing:
            return
        pgconn = connection.pgconn
        try:
            pgconn.consume_input()
            heard = False
            while pgconn.notifies() is not None:
                heard = True
        except (psycopg.Error, OSError):
            self._hearing = False
            self._forget_all()
            self._lost.set()
            log.warning("principal changes: the listening connection was lost")
            self._stop_reading()
            return
        if heard:
            self._forget_all()

    def _forget_all(self) -> None:
        self._remembered.clear()
        self._generation += 1


@asynccontextmanager
async def principal_cache(database_url: str) -> AsyncIterator[PrincipalCache]:
    """A cache that listens for principal changes for the duration of the block."""
    cache = PrincipalCache(database_url)
    listening = asyncio.create_task(cache.keep_listening(), name="principal changes")
    try:
        yield cache
    finally:
        listening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listening
