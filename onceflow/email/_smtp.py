"""One delivery attempt over SMTP, classified by how far the SMTP transaction got.

SMTP has no idempotency key: once the message has been sent after ``DATA``, a lost
reply leaves the outcome unknown and only the consumer's ``Message-ID`` dedupe (if it
has one) would make a resend harmless. So nothing here ever retries, and a relay's
``before_message`` hook runs after the 354, before any byte of the message, so that the
relay can record that it may be sent (or send nothing)::

    where it ended                                   reply or failure         outcome
    ──────────────────────────────────────────────   ──────────────────────   ─────────
    connect, greeting, EHLO, MAIL, RCPT, DATA (354)  refused, reset, timeout  transient
                                                     4xx                      transient
                                                     5xx                      rejected
    the message was sent, waiting for its reply      2xx                      delivered
                                                     4xx                      transient
                                                     5xx                      rejected
                                                     reset, timeout           unknown

Blocking code (``smtplib``): relays run it in a thread. Reasons never contain
addresses or the message, only the SMTP phase and the server's reply.
"""

import re
import smtplib
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from email import policy
from email.message import EmailMessage
from email.utils import format_datetime
from enum import StrEnum

from onceflow.email._settings import SmtpServer


class DeliveryOutcome(StrEnum):
    """How one delivery attempt ended, as far as the relay can prove."""

    DELIVERED = "delivered"
    """The server accepted the message (2xx after the message)."""
    REJECTED = "rejected"
    """The server refused it permanently (5xx); nothing was delivered."""
    TRANSIENT = "transient"
    """Nothing was delivered: refused before the message was sent, or 4xx."""
    UNKNOWN = "unknown"
    """The message was sent but its reply was lost: it may have been delivered."""


@dataclass(frozen=True)
class DeliveryReport:
    """The classified end of one delivery attempt."""

    outcome: DeliveryOutcome
    reason: str
    smtp_reply: str | None = None
    """The server's last reply (code and text), when there was one."""


@dataclass(frozen=True, kw_only=True)
class OutgoingMessage:
    """One email as the outbox holds it; rendering it twice gives the same bytes."""

    message_id: str
    """``<event id@domain>``: the consumer's dedupe key."""
    sender: str
    recipients: tuple[str, ...]
    subject: str
    body: str
    date: datetime

    def to_bytes(self) -> bytes:
        """The RFC 5322 message with CRLF line ends."""
        message = EmailMessage(policy=policy.SMTP)
        message["Message-ID"] = self.message_id
        message["Date"] = format_datetime(self.date)
        message["From"] = self.sender
        message["To"] = ", ".join(self.recipients)
        message["Subject"] = self.subject
        message.set_content(self.body)
        return message.as_bytes()


def deliver(
    server: SmtpServer,
    message: OutgoingMessage,
    *,
    timeout: float,
    before_message: Callable[[], bool] | None = None,
) -> DeliveryReport:
    """Make one delivery attempt and classify it; blocking, never raises for SMTP trouble.

    Args:
        server: Where to deliver.
        message: What to deliver.
        timeout: Longest wait, in seconds, for the connection and for each reply.
        before_message: Called after the server's 354, just before the message goes out
            (a relay records there that it may be sent); False (or an error) sends
            nothing: the connection is closed and the attempt is ``transient``.
    """
    client_type = smtplib.SMTP_SSL if server.implicit_tls else smtplib.SMTP
    client = client_type(local_hostname=socket.gethostname(), timeout=timeout)
    try:
        try:
            code, reply = client.connect(server.host, server.port)
        except (OSError, smtplib.SMTPException) as error:
            client.close()
            return _not_sent(f"could not connect to {server.describe()} ({_name(error)})")
        if code != 220:
            return _refused("the greeting", code, reply)
        try:
            client.ehlo_or_helo_if_needed()
            if server.username and server.password:
                client.login(server.username, server.password.get_secret_value())
            code, reply = client.mail(message.sender)
            if code != 250:
                return _refused("MAIL FROM", code, reply)
            for number, recipient in enumerate(message.recipients, start=1):
                code, reply = client.rcpt(recipient)
                if code not in (250, 251):
                    return _refused(
                        f"RCPT TO (recipient {number} of {len(message.recipients)})", code, reply
                    )
            code, reply = client.docmd("DATA")
            if code != 354:
                return _refused("DATA", code, reply)
            if before_message is not None and not _allowed(before_message):
                client.close()  # no end-of-data line: the server discards the transaction
                return _not_sent("the relay could not record that it sends the message")
        except smtplib.SMTPResponseException as error:
            return _refused("the session set-up", error.smtp_code, error.smtp_error)
        except (OSError, smtplib.SMTPException) as error:
            client.close()
            return _not_sent(f"the connection failed before the message was sent ({_name(error)})")
        try:
            client.send(_terminated(message.to_bytes()))
            code, reply = client.getreply()
        except (OSError, smtplib.SMTPException) as error:
            client.close()  # no QUIT on a connection whose state is unknown
            return DeliveryReport(
                DeliveryOutcome.UNKNOWN,
                f"{_name(error)} after the message was sent (DATA): the server may have "
                "accepted it; SMTP cannot tell, so it is not sent again automatically",
            )
        if 200 <= code < 300:
            return DeliveryReport(DeliveryOutcome.DELIVERED, "accepted", _reply(code, reply))
        if 400 <= code < 600:
            return _refused("the message", code, reply)
        return DeliveryReport(
            DeliveryOutcome.UNKNOWN,
            f"unexpected reply {code} after the message was sent",
            _reply(code, reply),
        )
    finally:
        _close(client)


def _allowed(before_message: Callable[[], bool]) -> bool:
    try:
        return before_message()
    except Exception:
        return False


def _terminated(data: bytes) -> bytes:
    """Dot-stuff the message and append the end-of-data line (RFC 5321 §4.5.2)."""
    stuffed = re.sub(rb"(?m)^\.", b"..", data)
    if not stuffed.endswith(b"\r\n"):
        stuffed += b"\r\n"
    return stuffed + b".\r\n"


def _refused(phase: str, code: int, reply: bytes | str) -> DeliveryReport:
    text = _reply(code, reply)
    if 500 <= code < 600:
        return DeliveryReport(
            DeliveryOutcome.REJECTED, f"the server refused {phase} permanently ({code})", text
        )
    return DeliveryReport(
        DeliveryOutcome.TRANSIENT, f"the server refused {phase} ({code}); nothing was sent", text
    )


def _not_sent(reason: str) -> DeliveryReport:
    return DeliveryReport(DeliveryOutcome.TRANSIENT, f"{reason}; nothing was sent")


def _reply(code: int, reply: bytes | str) -> str:
    text = reply.decode(errors="replace") if isinstance(reply, bytes) else reply
    return f"{code} {' '.join(text.split())}"[:300]


def _name(error: BaseException) -> str:
    # smtplib re-raises a socket timeout as SMTPServerDisconnected; the cause tells.
    if isinstance(error, TimeoutError) or isinstance(error.__context__, TimeoutError):
        return "timeout"
    if isinstance(error, smtplib.SMTPServerDisconnected | ConnectionError):
        return "connection closed"
    return type(error).__name__


def _close(client: smtplib.SMTP) -> None:
    try:
        if client.sock is not None:
            client.quit()
    except (OSError, smtplib.SMTPException):
        pass  # the attempt's outcome is already decided; QUIT is a courtesy
    finally:
        client.close()
