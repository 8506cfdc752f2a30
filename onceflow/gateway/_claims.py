"""The one claim mechanism behind every keyed request: a task start, a call of an open
task, a decision.

A request claims ``(scope, key)`` under its fingerprint in PostgreSQL (``settle``); its
owner acts and stores the answer as the key's result, or releases the claim when it got no
answer and a resend is safe. Another request with the same key and fingerprint waits a
bounded time for that result, takes the claim over once its owner's lease ran out, or is
told the key is in progress; one with another fingerprint is refused. Tasks, calls and
decisions differ only in what the owner does and what a finished record answers.

A final answer read from the table is remembered (``_answer_cache``), and a repeat of its
request is settled from memory exactly as from the record (the same fingerprint check,
the same ``finished`` answer), without a database round trip.
"""

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg_pool import PoolTimeout

from onceflow.errors import (
    KEY_REUSED_DETAIL,
    KeyReusedWithDifferentRequest,
    OnceflowError,
    RequestInProgress,
)
from onceflow.gateway._answer_cache import AnswerCache
from onceflow.gateway._backend import backend_errors
from onceflow.gateway._principals import Principal
from onceflow.gateway._settings import GatewaySettings
from onceflow.idempotency import (
    AlreadyClaimed,
    Claimed,
    IdempotencyRecord,
    IdempotencyStore,
    NewClaim,
    RecordState,
)
from onceflow.tools.worker import key_digest

log = logging.getLogger("onceflow.gateway")

_POLL_FIRST, _POLL_MAX = 0.02, 0.25
_Answer = TypeVar("_Answer")
"""What a keyed request answers: a task, a call or a decision."""


class Claims:
    """Claims keys for requests, settles with their owners, stores or releases answers."""

    def __init__(
        self,
        records: IdempotencyStore,
        settings: GatewaySettings,
        answers: AnswerCache | None = None,
    ) -> None:
        """``answers``: where final answers are remembered (none without it)."""
        self._records = records
        self._settings = settings
        self._answers = answers if answers is not None else AnswerCache(0, heard=lambda: None)

    async def earlier(self, scope: str, idempotency_key: str) -> IdempotencyRecord | None:
        """The record of ``(scope, key)`` if the key was used before: a remembered final
        answer, else read from the table (and remembered when final). Pass it to
        ``settle`` as ``earlier``."""
        remembered = self._answers.answer(scope, idempotency_key)
        if remembered is not None:
            return remembered
        read_in = self._answers.generation()
        async with backend_errors():
            record = await self._records.get(scope, idempotency_key)
        if record is not None:
            self._answers.keep(record, read_in=read_in)
        return record

    def repeat(
        self, scope: str, idempotency_key: str, request_digest: str
    ) -> IdempotencyRecord | None:
        """The remembered final record of ``(scope, key)`` if a request with exactly
        these bytes (``request_digest``) was vouched for under it: a repeat answered with
        no parse, validation, fingerprint or round trip. None: handle it in full."""
        return self._answers.answer_request(scope, idempotency_key, request_digest)

    def vouch(
        self, scope: str, idempotency_key: str, *, fingerprint: str, request_digest: str
    ) -> None:
        """After a request was checked in full: its bytes make ``fingerprint``, so they
        answer by ``repeat`` from now on if that is the remembered record's."""
        self._answers.vouch(
            scope, idempotency_key, fingerprint=fingerprint, request_digest=request_digest
        )

    def new(
        self,
        principal: Principal,
        *,
        scope: str,
        idempotency_key: str,
        fingerprint: str,
        workflow_id: str,
    ) -> NewClaim:
        """The claim a request by ``principal`` makes, under the gateway settings: lease, retention
        and key quota."""
        return NewClaim(
            scope=scope,
            idempotency_key=idempotency_key,
            request_hash=fingerprint,
            tenant=principal.tenant,
            principal_id=principal.principal_id,
            workflow_id=workflow_id,
            lease=self._settings.claim_lease,
            result_retention=self._settings.result_retention,
            key_quota=principal.key_quota or self._settings.default_key_quota,
            quota_window_seconds=self._settings.quota_window_seconds,
        )

    def reply_deadline(self) -> float:
        """When a request stops waiting for another one holding its key (loop time)."""
        return asyncio.get_running_loop().time() + self._settings.replay_wait_seconds

    async def settle(
        self,
        claim: NewClaim,
        *,
        target: str,
        doing: str,
        deadline: float,
        owned: Callable[[IdempotencyRecord], Awaitable[_Answer]],
        finished: Callable[[IdempotencyRecord], Awaitable[_Answer]],
        earlier: IdempotencyRecord | None = None,
        in_flight: Callable[[IdempotencyRecord], Awaitable[_Answer | None]] | None = None,
        retry_after: Callable[[IdempotencyRecord], float] | None = None,
    ) -> _Answer:
        """Claim ``(scope, key)`` or settle with whoever holds it: the one loop behind
        every keyed request.

        Args:
            claim: The claim this request makes.
            target: The task it is about, for logs.
            doing: What the key's owner is doing, for the in-progress answer.
            deadline: Loop time after which the request stops waiting for an owner.
            owned: Runs the request once this one holds the claim (new or taken over).
            finished: Answers from a terminal record with the same fingerprint.
            earlier: The record already read for this key, if any (no claim attempt).
            in_flight: Answers from a live owner's record when it can (None: keep waiting).
            retry_after: Seconds a caller should wait when the owner is still at it.
                Default: what is left of the owner's lease.

        Raises:
            KeyReusedWithDifferentRequest: The key's record has another fingerprint.
            RequestInProgress: Another request still holds the key at ``deadline``.
        """
        digest = key_digest(claim.idempotency_key)
        loop = asyncio.get_running_loop()
        pause = _POLL_FIRST
        if earlier is None:
            earlier = self._answers.answer(claim.scope, claim.idempotency_key)
        # Only a record this loop reads from the table is remembered here (``earlier`` was
        # by whoever read it), in the generation read before the read: a change heard
        # meanwhile keeps it from being remembered.
        read_here = earlier is None
        read_in = self._answers.generation() if read_here else None
        async with backend_errors():
            outcome: Claimed | AlreadyClaimed = (
                AlreadyClaimed(earlier) if earlier is not None else await self._records.claim(claim)
            )
            while True:
                if isinstance(outcome, Claimed):
                    log.info("claimed key %s in %s for task %s", digest, claim.scope, target)
                    return await owned(outcome.record)
                record = outcome.record
                if record.request_hash != claim.request_hash:
                    log.info(
                        "refused key %s in %s: reused for another request", digest, claim.scope
                    )
                    raise KeyReusedWithDifferentRequest(KEY_REUSED_DETAIL, key_digest=digest)
                if record.is_terminal:
                    # Debug only: a replay changes nothing, and its request's span already
                    # says it was one (``onceflow.replayed``, the key's digest). A line per
                    # retry, scrubbed and written, cost a replay more than validating and
                    # fingerprinting its body, and a duplicate storm wrote one per request.
                    log.debug("replaying key %s in %s (task %s)", digest, claim.scope, target)
                    if read_here:
                        self._answers.keep(record, read_in=read_in)
                    return await finished(record)
                if in_flight is not None:
                    answer = await in_flight(record)
                    if answer is not None:
                        return answer
                if record.lease_expired:
                    taken = await self._records.take_over(record, lease=claim.lease)
                    if taken is not None:
                        log.warning(
                            "took over key %s in %s after its claim's lease expired "
                            "(fencing token %d)",
                            digest,
                            claim.scope,
                            taken.fencing_token,
                        )
                        return await owned(taken)
                left = deadline - loop.time()
                if left <= 0:
                    wait = retry_after(record) if retry_after else record.lease_left.total_seconds()
                    raise RequestInProgress(
                        f"another request with this Idempotency-Key is {doing}; retry with "
                        "the same key and body",
                        retry_after_seconds=max(1, math.ceil(wait)),
                        key_digest=digest,
                    )
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, _POLL_MAX)
                read_here, read_in = True, self._answers.generation()
                current = await self._records.get(claim.scope, claim.idempotency_key)
                # Gone (pruned, or released after a failure) means nobody holds the key
                # now: claim it anew.
                outcome = (
                    AlreadyClaimed(current)
                    if current is not None
                    else await self._records.claim(claim)
                )

    async def answer_once(
        self,
        record: IdempotencyRecord,
        *,
        target: str,
        doing: str,
        ask: Callable[[], Awaitable[_Answer]],
        stored: Callable[[_Answer], tuple[int, dict[str, Any]]],
        refusals: tuple[type[OnceflowError], ...],
    ) -> _Answer:
        """The owner's part for a call or a decision: ask the task, keep its answer.

        The answer (``stored`` turns it into a status and a body) and each of
        ``refusals``, the task's own definitive answers, become the key's result. When no
        answer came (the task service or the database failed), the claim goes: a call or a
        decision is sent under its own id (the call id, the step's one decision), so a
        retry with the key sends it again and the task answers it by that id, never acting
        twice.
        """
        try:
            answer = await ask()
        except refusals as refused:
            await self.store(record, target, refused, doing=doing)
            raise
        except Exception:
            await self.release(record)
            raise
        await self.store(record, target, stored(answer), doing=doing)
        return answer

    async def store(
        self,
        record: IdempotencyRecord,
        target: str,
        answer: tuple[int, dict[str, Any]] | OnceflowError,
        *,
        doing: str,
    ) -> None:
        """Keep ``answer`` (a status and a body, or a refusal) as the key's result."""
        if isinstance(answer, OnceflowError):
            state, status_code, body = RecordState.FAILED, answer.status, answer.problem()
        else:
            state, (status_code, body) = RecordState.SUCCEEDED, answer
        stored = await self._records.complete(
            record, state=state, status_code=status_code, response_body=body, resource_id=target
        )
        if not stored:
            log.warning(
                "claim of key %s in %s was taken over while %s task %s",
                key_digest(record.idempotency_key),
                record.scope,
                doing,
                target,
            )

    async def release(self, record: IdempotencyRecord) -> None:
        """Give the key up: a retry with it claims it anew."""
        try:
            await self._records.release(record)
        except (psycopg.Error, PoolTimeout) as error:
            # The claim's lease runs out instead; a retry with the key then takes it over.
            log.warning(
                "could not release key %s in %s (%s)",
                key_digest(record.idempotency_key),
                record.scope,
                type(error).__name__,
            )
