"""The outbox relay: claims armed rows and makes one SMTP delivery per claim.

Any number of relays may run (``onceflow relay`` processes, or a task beside a worker):
``FOR UPDATE SKIP LOCKED`` hands each armed row to one of them. A relay renews its
claim while it delivers, so only a dead or stalled relay's claim expires; another relay
then takes the row over and decides from what the dead claim recorded:

* a delivery of it began sending the message (``message_sent_at``, set after the
  server's 354 under the live claim) and has no outcome: it may have passed ``DATA``,
  so the relay records ``unknown`` and sends nothing; the step parks exactly as for a
  reply lost after ``DATA``, and only an operator's ``did_not_happen`` re-arms it;
* otherwise nothing was sent (the relay died before connecting, before ``DATA``, or
  before starting at all), and the relay delivers the email itself.

A relay never retries on its own: it records the classified outcome and the workflow
decides whether the email is armed again.

Each delivery's span (``smtp deliver``) is a child of the ``send_email`` attempt that
armed the email (its context travels in the outbox row), so it is part of the task's
trace; a row without a valid stored context is delivered in a trace of its own.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable

from psycopg_pool import AsyncConnectionPool

from onceflow.email._settings import EmailSettings, SmtpServer
from onceflow.email._smtp import DeliveryOutcome, DeliveryReport, deliver
from onceflow.email._store import Claim, EmailOutbox
from onceflow.storage import build_pool
from onceflow.telemetry import outbound_call

_log = logging.getLogger(__name__)


class OutboxRelay:
    """One relay over a connection pool, delivering to ``settings.smtp_url``.

    Raises:
        ValueError: ``SMTP_URL`` is not set.
    """

    def __init__(self, pool: AsyncConnectionPool, settings: EmailSettings) -> None:
        self._outbox = EmailOutbox(pool)
        self._settings = settings
        self._server = settings.smtp_server
        self.relay_id = settings.relay_id

    @property
    def server(self) -> SmtpServer:
        """Where this relay delivers."""
        return self._server

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop`` is set; a delivery in progress is finished first."""
        idle = self._settings.poll_interval.total_seconds()
        while not stop.is_set():
            try:
                claims = await self._outbox.claim(
                    relay_id=self.relay_id,
                    lease=self._settings.claim_lease,
                    limit=self._settings.batch_size,
                )
            except Exception as error:  # a database hiccup must not end the relay
                _log.warning("relay %s could not claim rows: %s", self.relay_id, error)
                claims = []
            if not claims:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=idle)
                continue
            for number, claim in enumerate(claims):
                if stop.is_set():
                    await self._release(claims[number:])
                    break
                await self.deliver_claim(claim)

    async def deliver_claim(self, claim: Claim) -> DeliveryReport | None:
        """Make one delivery for a claim and record it; None when the claim was lost.

        A claim taken over from a relay that may have sent the message is concluded
        ``unknown`` without a delivery (the report returned is that outcome).
        """
        lease = self._settings.claim_lease
        if claim.took_over:
            try:
                concluded = await self._outbox.conclude_takeover(claim, relay_id=self.relay_id)
            except Exception as error:  # the claim expires and the next relay concludes it
                _log.warning("relay %s could not conclude a takeover: %s", self.relay_id, error)
                return None
            if concluded is not None:
                _log.warning(
                    "relay %s did not resend %s: %s",
                    self.relay_id,
                    claim.event_id,
                    concluded.reason,
                )
                return concluded
        try:
            delivery_id = await self._outbox.start_delivery(
                claim, relay_id=self.relay_id, lease=lease
            )
        except Exception as error:
            _log.warning("relay %s could not start a delivery: %s", self.relay_id, error)
            return None
        if delivery_id is None:
            return None  # the claim expired before we began; another relay has it
        keeper = asyncio.create_task(self._keep_claim(claim))
        loop = asyncio.get_running_loop()
        timeout = self._settings.smtp_timeout.total_seconds()

        def before_message() -> bool:
            # Runs in the delivery's thread: the mark commits before any byte of the message.
            marking = asyncio.run_coroutine_threadsafe(
                self._outbox.mark_message_sent(claim, delivery_id, lease=lease), loop
            )
            try:
                return marking.result(timeout=timeout)
            except Exception as error:
                marking.cancel()
                _log.warning("relay %s could not mark a message sent: %s", self.relay_id, error)
                return False

        with outbound_call(
            "smtp",
            "deliver",
            {
                "smtp.message_id": claim.message.message_id,
                "onceflow.email_event_id": claim.event_id,
                "onceflow.email_arming": claim.arming,
                "onceflow.relay": self.relay_id,
            },
            # In the trace of the attempt that armed the email; a row without one starts
            # a trace of its own.
            parent=claim.trace_context.parent() if claim.trace_context else None,
        ) as span:
            try:
                report = await asyncio.to_thread(
                    deliver,
                    self._server,
                    claim.message,
                    timeout=timeout,
                    before_message=before_message,
                )
            except Exception as error:  # a bug must not end the relay; how far it got is unknown
                _log.exception("relay %s failed delivering %s", self.relay_id, claim.event_id)
                report = DeliveryReport(
                    DeliveryOutcome.UNKNOWN,
                    f"the relay failed while delivering ({type(error).__name__})",
                )
            finally:
                keeper.cancel()
                await asyncio.gather(keeper, return_exceptions=True)
            span.set_attribute("smtp.outcome", report.outcome.value)
        try:
            current = await self._outbox.record(claim, delivery_id, report)
        except Exception as error:
            # The claim expires; the relay taking it over records unknown if the message
            # may have been sent (the step parks), else delivers it.
            _log.warning("relay %s could not record an outcome: %s", self.relay_id, error)
            return report
        if not current:
            _log.info("relay %s: its claim on %s was taken over", self.relay_id, claim.event_id)
        return report

    async def _keep_claim(self, claim: Claim) -> None:
        lease = self._settings.claim_lease
        while True:
            await asyncio.sleep(lease.total_seconds() / 3)
            try:
                if not await self._outbox.renew(claim, lease=lease):
                    return
            except Exception as error:
                _log.warning("relay %s could not renew a claim: %s", self.relay_id, error)

    async def _release(self, claims: list[Claim]) -> None:
        for claim in claims:
            with contextlib.suppress(Exception):  # an unreleased claim simply expires
                await self._outbox.release(claim)


async def serve_relay(
    settings: EmailSettings,
    *,
    database_url: str,
    stop: asyncio.Event,
    on_ready: Callable[[OutboxRelay], None] | None = None,
) -> None:
    """Run one relay with its own small pool until ``stop`` is set."""
    async with build_pool(database_url, max_size=2) as pool:
        relay = OutboxRelay(pool, settings)
        if on_ready is not None:
            on_ready(relay)
        await relay.run(stop)
