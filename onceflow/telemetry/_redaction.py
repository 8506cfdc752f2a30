"""Finds what must never leave a process in a log line, a span or a task's history.

One filter serves two masters: ``scrub`` replaces what it finds in telemetry text, and the
gateway refuses tool arguments in which ``sensitive_locations`` or ``unstorable_locations``
finds anything (arguments become a task's history, stored and shown in clear). It runs on
every request and every log line, so every pattern is precompiled, bounded or possessive,
and anchored on a boundary: no input makes it backtrack or rescan (a 100 KB string is one
pass). Idempotency keys have no shape to recognise: they are kept out by construction
(only ``key_digest`` of a key is ever written), and the tests plant one to prove it.

**Card numbers.** A candidate is a run of ASCII digit groups joined by one to three
separator characters (space, tab, no-break and thin spaces, ``-`` and the Unicode dashes,
``.``, ``_``, ``:``, ``/``, mixed freely); commas and line breaks end a run. Every window
of whole groups holding 13 to 19 digits is checked with Luhn, so group sizes do not matter
and a card followed by its expiry and CVC is still found. Not cards, by design:

* a run that continues a word, with a letter right before it or a letter and one ``-`` or
  ``_`` (``ord-4242…``, ``pi_…``, ``sha256:…``, ``DE89 3704 …``, ``v1.2.3``), and a run
  of one group with a letter right after it, directly or through ``-``/``_``: identifiers;
  but not after a payment credential's prefix (``pm_``, ``card_``, ``tok_``, ``src_``,
  ``ba_``): ``pm_4242…`` is a card number dressed as a PaymentMethod id;
* a run inside a UUID, and a valid IBAN (mod 97): account identifiers, not card data;
* a run after ``+`` of at most 15 digits: an E.164 phone number;
* a run that is exactly a date or a date and time (``2026-05-01 12:34:56.789``,
  ``01.05.2026``) or an IPv4 address with an optional port;
* a window starting with ``0`` (ISO/IEC 7812 issues no payment card under MII 0: phone
  prefixes, zero padding), a 13-digit window starting with ``978``/``979`` (ISBN-13 and
  EAN "Bookland" codes), and one unseparated group of 13, 16 or 19 digits starting with
  ``1`` (epoch milliseconds, microseconds, nanoseconds from 2001 to 2033; the one card
  scheme under MII 1, UATP, issues 15 digits).

**Credentials.** onceflow API keys, AWS access key ids and secret access keys, Google API
keys and service-account key files, PEM private keys, JWTs (three base64url segments whose
header decodes to JSON with ``alg``), GitHub and Slack tokens, OpenAI and Anthropic keys,
``Bearer`` credentials of at least 8 characters and HTTP Basic credentials, passwords in
URLs, and assignments such as ``password=…`` or ``"api_key": "…"`` with a real value (not
empty, masked or a placeholder). In a JSON-like value, a string under a key named like a credential
(``password``, ``client_secret``, ``apiKey``, … but not the ambiguous ``token``) counts too.
And every ``Redaction`` a loaded tool family declares (``onceflow.tools.ToolFamily``: the
payment family's Stripe keys and client secrets, a user's family's own), matched where no
letter or digit precedes it, exactly as the rules above.

**Unstorable text.** NUL (which PostgreSQL text cannot hold) and surrogate code points
(what JSON's ``\\ud800`` escapes decode to when unpaired; no UTF-8 encoder takes them).
"""

import base64
import binascii
import functools
import json
import re
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from onceflow.tools import Redaction, ToolFamily
from onceflow.tools.worker import loaded_families

CARD_NUMBER_REMOVED = "[card number removed]"
SECRET_REMOVED = "[secret removed]"

# ── card numbers ───────────────────────────────────────────────────────────────────

_SEPARATOR = r"[ \t\u00a0\u2007\u2009\u202f._:/\u2010-\u2015\u2212-]"
_DIGIT_RUN = re.compile(rf"[0-9]+(?:{_SEPARATOR}{{1,3}}[0-9]+)*")
_DIGITS = re.compile(r"[0-9]+")
_MIN_DIGITS, _MAX_DIGITS = 13, 19
_PHONE_MAX_DIGITS = 15
"""E.164's longest number, country code included."""
_EPOCH_LENGTHS = (13, 16, 19)

_YEAR = r"(?:19|20)[0-9]{2}"
_MONTH = r"(?:0[1-9]|1[0-2])"
_DAY = r"(?:0[1-9]|[12][0-9]|3[01])"
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9](?::[0-5][0-9](?:[.:][0-9]{1,9})?)?"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_NOT_A_CARD_RUN = re.compile(
    rf"(?:{_YEAR}(?P<ymd>[-/.]){_MONTH}(?P=ymd){_DAY}"
    rf"|{_DAY}(?P<dmy>[-/.]){_MONTH}(?P=dmy){_YEAR}"
    rf"|{_MONTH}/{_DAY}/{_YEAR})"
    rf"(?:[ \t]{{1,3}}{_TIME})?"
    rf"|{_OCTET}(?:\.{_OCTET}){{3}}(?::[0-9]{{1,5}})?"
)
_UUID = re.compile(
    r"(?<![0-9A-Fa-f])[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-"
    r"[0-9A-Fa-f]{12}(?![0-9A-Fa-f])"
)
_IBAN = re.compile(
    r"(?<![A-Za-z0-9])[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?(?![A-Za-z0-9])"
)


def _passes_luhn(digits: str) -> bool:
    return _luhn_shares(digits, 0, len(digits))[0] % 10 == 0


def _is_iban(text: str) -> bool:
    compact = text.replace(" ", "")
    rearranged = compact[4:] + compact[:4]
    return int("".join(str(int(char, 36)) for char in rearranged)) % 97 == 1


_PAYMENT_ID_PREFIX = re.compile(r"(?<![A-Za-z0-9])(?i:pm|card|tok|src|ba)_\Z")
"""A payment-credential id's prefix (PaymentMethod, card, token, source, bank account):
glued to it, a Luhn-valid run is a card number in disguise, not an identifier (the
provider's own ids carry letters)."""
_IDENTIFIER_MAX_LENGTH = 42
"""The longest UUID or IBAN match: 34 characters and 8 spaces."""


def _identifier_spans(text: str) -> list[tuple[int, int]]:
    """UUIDs and valid IBANs, by start: digit runs inside them are not card numbers."""
    spans = [match.span() for match in _UUID.finditer(text)]
    spans += [match.span() for match in _IBAN.finditer(text) if _is_iban(match.group())]
    return sorted(spans)


def _card_spans(text: str) -> list[tuple[int, int]]:
    """Where ``text`` holds card numbers, in order."""
    found: list[tuple[int, int]] = []
    identifiers: list[tuple[int, int]] | None = None
    for run in _DIGIT_RUN.finditer(text):
        if run.end() - run.start() < _MIN_DIGITS:
            continue
        groups = [digits.span() for digits in _DIGITS.finditer(text, run.start(), run.end())]
        if sum(end - start for start, end in groups) < _MIN_DIGITS:
            continue
        if identifiers is None:
            identifiers = _identifier_spans(text)
        # Only identifiers that start shortly before the run's end can overlap it.
        low = bisect_left(identifiers, (run.start() - _IDENTIFIER_MAX_LENGTH,))
        nearby = identifiers[low : bisect_left(identifiers, (run.end(),))]
        for segment in _outside(groups, nearby):
            found += _cards_in_run(text, segment)
    return found


def _outside(
    groups: list[tuple[int, int]], identifiers: list[tuple[int, int]]
) -> Iterator[list[tuple[int, int]]]:
    """``groups`` split where a group lies in an identifier's span, those groups left out."""
    segment: list[tuple[int, int]] = []
    for start, end in groups:
        if any(start < until and end > since for since, until in identifiers):
            if segment:
                yield segment
            segment = []
        else:
            segment.append((start, end))
    if segment:
        yield segment


def _cards_in_run(text: str, groups: list[tuple[int, int]]) -> list[tuple[int, int]]:
    first, last = groups[0][0], groups[-1][1]
    before = text[first - 1] if first else ""
    glued = before.isalpha() or (before in "-_" and first > 1 and text[first - 2].isalpha())
    if glued and not _PAYMENT_ID_PREFIX.search(text, max(first - 8, 0), first):
        return []
    after = text[last : last + 2]
    if len(groups) == 1 and (after[:1].isalpha() or (after[:1] in "-_" and after[1:].isalpha())):
        return []
    digit_count = sum(end - start for start, end in groups)
    if before == "+" and digit_count <= _PHONE_MAX_DIGITS:
        return []
    if _NOT_A_CARD_RUN.fullmatch(text, first, last):
        return []
    return _luhn_windows(text, groups)


def _luhn_windows(text: str, groups: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Card numbers among the windows of whole groups, left to right, not overlapping.

    For each last group the window grows leftwards, so the Luhn sum (which weighs digits
    by their place from the right) grows by one group's precomputed share at a time: at
    most 19 steps per group, linear in the run however its digits are grouped.
    """
    shares = [_luhn_shares(text, start, end) for start, end in groups]
    found: list[tuple[int, int]] = []
    floor = 0
    for last in range(len(groups)):
        total = count = 0
        widest: int | None = None
        for first in range(last, floor - 1, -1):
            length = groups[first][1] - groups[first][0]
            if count + length > _MAX_DIGITS:
                break
            total += shares[first][count % 2]
            count += length
            if count >= _MIN_DIGITS and total % 10 == 0 and _may_be_card(text, groups, first, last):
                widest = first
        if widest is not None:
            through = _widened(text, groups, widest, last)
            found.append((groups[widest][0], groups[through][1]))
            floor = through + 1
    return found


_DOUBLED = (0, 2, 4, 6, 8, 1, 3, 5, 7, 9)


def _luhn_shares(text: str, start: int, end: int) -> tuple[int, int]:
    """A group's share of a Luhn sum when an even or an odd number of digits follow it."""
    if end - start > _MAX_DIGITS:
        return 0, 0  # never inside a window
    even = odd = 0
    for place, char in enumerate(reversed(text[start:end])):
        digit = ord(char) - 48
        even += _DOUBLED[digit] if place % 2 else digit
        odd += digit if place % 2 else _DOUBLED[digit]
    return even, odd


def _window_digits(text: str, groups: list[tuple[int, int]], first: int, last: int) -> str:
    return "".join(text[start:end] for start, end in groups[first : last + 1])


def _may_be_card(text: str, groups: list[tuple[int, int]], first: int, last: int) -> bool:
    digits = _window_digits(text, groups, first, last)
    if digits[0] == "0":
        return False
    if len(digits) == _MIN_DIGITS and digits[:3] in ("978", "979"):
        return False
    return not (first == last and digits[0] == "1" and len(digits) in _EPOCH_LENGTHS)


def _widened(text: str, groups: list[tuple[int, int]], first: int, last: int) -> int:
    """The last group of the longest card number starting at ``first``: the groups after a
    13-digit prefix that happens to pass Luhn are scrubbed too."""
    widest = last
    for candidate in range(last + 1, len(groups)):
        digits = _window_digits(text, groups, first, candidate)
        if len(digits) > _MAX_DIGITS:
            break
        if _passes_luhn(digits):
            widest = candidate
    return widest


# ── credentials ────────────────────────────────────────────────────────────────────

_CREDENTIAL_WORDS = (
    r"password|passwd|passphrase|client[_-]?secret|secret[_-]?key|secret|api[_-]?key"
    r"|access[_-]?token|auth[_-]?token|refresh[_-]?token|private[_-]?key"
)
_AT_WORD_START: tuple[tuple[str, str, str], ...] = (
    # (group name, what it is, pattern): each starts where no letter or digit precedes it,
    # one shared look-behind for all, so the scan skips the inside of every word at once.
    # A group ``<name>_value`` is what ``scrub`` removes (the whole match otherwise).
    ("onceflow_key", "onceflow API key", r"ofk_[A-Za-z0-9_-]{8,}+"),
    ("aws_key_id", "AWS access key", r"(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
    (
        "aws_secret",
        "AWS secret access key",
        r"(?i:(?:aws_?)?secret_?access_?key)[\"']?\s{0,5}[:=]\s{0,5}[\"']?"
        r"(?P<aws_secret_value>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])",
    ),
    ("google_key", "Google API key", r"(?<![_-])AIza[A-Za-z0-9_-]{35}(?![A-Za-z0-9_-])"),
    (
        "jwt",
        "JWT",
        r"(?<![_-])e[wy][A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]{2,}+\.[A-Za-z0-9_-]*+",
    ),
    (
        "github_token",
        "GitHub token",
        r"gh[pousr]_[A-Za-z0-9]{30,}+|github_pat_[A-Za-z0-9_]{30,}+",
    ),
    (
        "slack_token",
        "Slack token",
        r"xox[abprs]-[A-Za-z0-9-]{10,}+|xapp-[0-9]-[A-Za-z0-9-]{10,}+",
    ),
    ("ai_key", "OpenAI or Anthropic API key", r"(?<![_-])sk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,}+"),
    (
        "bearer",
        "bearer credential",
        r"(?i:bearer)\s{1,5}(?P<bearer_value>[A-Za-z0-9._~+/-]{8,}+=*)",
    ),
    (
        "basic",
        "basic credential",
        r"(?i:basic)\s{1,5}(?P<basic_value>[A-Za-z0-9+/]{8,}+={0,2})",
    ),
    (
        "assignment",
        "assigned credential",
        rf"(?i:{_CREDENTIAL_WORDS})(?![A-Za-z0-9])[\"']?\s{{0,5}}"
        r"(?P<assignment_operator>[:=])\s{0,5}"
        r"(?P<assignment_value>\"[^\"\n]{1,256}+\"|'[^'\n]{1,256}+'|[^\s\"',;&)\]}]{1,256}+)",
    ),
)
_ANYWHERE: tuple[tuple[str, str, str], ...] = (
    # A PEM block inside JSON text follows "\n", a letter; a URL's credentials follow its
    # scheme: these start anywhere.
    (
        "private_key",
        "private key",
        r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
        r"(?:[^-]{0,20000}+-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
        r"|[A-Za-z0-9+/=\s\\]{0,20000}+)",
    ),
    (
        "gcp_service_account",
        "GCP service-account key",
        r"\"private_key_id\"\s{0,5}:\s{0,5}\"[0-9a-f]{40}\"",
    ),
    (
        "url_password",
        "password in a URL",
        r"(?<=[A-Za-z0-9])://[^\s/@:]{1,256}+:(?P<url_password_value>[^\s/@]{1,256}+)@",
    ),
    (
        "slack_webhook",
        "Slack webhook URL",
        r"hooks\.slack\.com/services/T[A-Za-z0-9]+/B[A-Za-z0-9]+/[A-Za-z0-9]++",
    ),
)
_SECRET = re.compile(
    # Every rule at a word start begins with one of these letters: most positions are
    # passed over on one character test.
    "(?=[AaBbCcEeGgOoPpRrSsWwXx])(?<![A-Za-z0-9])(?:"
    + "|".join(f"(?P<{name}>{pattern})" for name, _, pattern in _AT_WORD_START)
    + ")|"
    + "|".join(f"(?P<{name}>{pattern})" for name, _, pattern in _ANYWHERE)
)
_WHAT = {name: what for name, what, _ in _AT_WORD_START + _ANYWHERE}
_CREDENTIAL_KEY = re.compile(
    rf"(?:[a-z0-9]+_)*(?:{_CREDENTIAL_WORDS.replace('[_-]?', '_?')})", re.IGNORECASE
)
_PLACEHOLDERS = frozenset(
    ("null", "none", "nil", "true", "false", "yes", "no", "undefined", "redacted", "hidden")
    + ("password", "passwd", "pass", "secret", "api_key", "apikey", "key", "token")
)
_NAME = re.compile(r"[A-Z][A-Z_]*|[a-z_]+(?:\.[a-z_]+)+")
"""What stands for a value in code and docs: ``API_KEY``, ``settings.api_key``."""


def _is_opaque_token(token: str) -> bool:
    # "Bearer instruments" is prose: a word of letters, lower-case but for its first;
    # "Bearer YOUR_API_KEY" is documentation.
    prose = token.isalpha() and token[1:].islower()
    return not prose and _NAME.fullmatch(token) is None


def _is_basic_credential(encoded: str) -> bool:
    try:
        decoded = base64.b64decode(encoded, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return False
    return ":" in decoded and decoded.isprintable()


def _is_jwt(token: str) -> bool:
    header = token.split(".", 1)[0]
    try:
        decoded = json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4)))
    except (binascii.Error, ValueError):
        return False
    return isinstance(decoded, dict) and "alg" in decoded


def _is_assigned_value(value: str, operator: str = "=") -> bool:
    quoted = value[:1] in "\"'" and value[-1:] == value[:1] and len(value) > 1
    value = value[1:-1] if quoted else value
    if len(value) < 3 or value.lower() in _PLACEHOLDERS or value[0] in "<[{$%…":
        return False
    if not quoted and _NAME.fullmatch(value):
        return False
    if len(set(value)) == 1 or set(value) <= set("*•x.-_#"):
        return False  # masked: "***", "xxxx", "••••"
    # "password: required" is prose; a real value has a digit or a symbol.
    return quoted or operator == "=" or not value.isalpha()


_VERIFY: dict[str, Callable[[re.Match[str]], bool]] = {
    "bearer": lambda match: _is_opaque_token(match["bearer_value"]),
    "basic": lambda match: _is_basic_credential(match["basic_value"]),
    "jwt": lambda match: _is_jwt(match["jwt"]),
    "url_password": lambda match: _is_assigned_value(match["url_password_value"]),
    "assignment": lambda match: _is_assigned_value(
        match["assignment_value"], match["assignment_operator"]
    ),
}


class _Found(NamedTuple):
    """One secret in a text: where it is, what of it is removed, what it is."""

    start: int
    end: int
    removed: tuple[int, int]
    what: str


def _secret_matches(text: str) -> Iterator[_Found]:
    """The secrets in ``text``, left to right, none inside another: onceflow's rules and
    the loaded families' redactions, the earlier start first (onceflow's on a tie)."""
    found = sorted([*_rule_matches(text), *_family_matches(text)], key=lambda secret: secret.start)
    end = 0
    for secret in found:
        if secret.start >= end:
            yield secret
            end = max(secret.end, secret.start + 1)


def _rule_matches(text: str) -> Iterator[_Found]:
    position = 0
    while (match := _SECRET.search(text, position)) is not None:
        name = str(match.lastgroup)
        verify = _VERIFY.get(name)
        if verify is None or verify(match):
            value = f"{name}_value"
            removed = match.span(value) if value in _SECRET.groupindex else match.span()
            yield _Found(match.start(), match.end(), removed, _WHAT[name])
            position = max(match.end(), match.start() + 1)
        else:
            # A shape that is not a secret (prose after "Bearer"): look again just after
            # its start, where a real secret may begin inside it.
            position = match.start() + 1


def _family_matches(text: str) -> Iterator[_Found]:
    pattern, what = _loaded_families_pattern()
    if pattern is None:
        return
    position = 0
    while (match := pattern.search(text, position)) is not None:
        name = str(match.lastgroup)
        value = f"{name}_value"
        removed = match.span(value) if value in pattern.groupindex else match.span()
        yield _Found(match.start(), match.end(), removed, what[name])
        position = max(match.end(), match.start() + 1)


_VALUE_GROUP = re.compile(r"\(\?P<value>")

_loaded_patterns: tuple[tuple[ToolFamily, ...], tuple[re.Pattern[str] | None, dict[str, str]]] = (
    (),
    (None, {}),
)
"""The families last seen loaded and their pattern, replaced in one assignment (a log
line may be scrubbed on any thread)."""


def _loaded_families_pattern() -> tuple[re.Pattern[str] | None, dict[str, str]]:
    """The loaded families' pattern, collected again only when the families change: it
    is asked for on every text scanned (each log line, each string of each request's
    arguments), and collecting their redactions each time cost as much as matching."""
    global _loaded_patterns
    families = loaded_families()
    seen, compiled = _loaded_patterns
    # The same family objects compare by identity first: one pass over a short tuple.
    if families != seen:
        redactions = dict.fromkeys(
            redaction for family in families for redaction in family.redactions
        )
        compiled = _family_pattern(tuple(redactions))
        _loaded_patterns = (families, compiled)
    return compiled


@functools.lru_cache(maxsize=8)
def _family_pattern(
    redactions: tuple[Redaction, ...],
) -> tuple[re.Pattern[str] | None, dict[str, str]]:
    """One pattern for all of ``redactions`` (compiled once per set), and what each of its
    groups finds."""
    if not redactions:
        return None, {}
    what = {f"family_{index}": redaction.what for index, redaction in enumerate(redactions)}
    alternatives = [
        f"(?P<family_{index}>{_VALUE_GROUP.sub(f'(?P<family_{index}_value>', redaction.pattern)})"
        for index, redaction in enumerate(redactions)
    ]
    return re.compile("(?<![A-Za-z0-9])(?:" + "|".join(alternatives) + ")"), what


# ── text that cannot be stored ─────────────────────────────────────────────────────

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


# ── the public face ────────────────────────────────────────────────────────────────


class Finding(NamedTuple):
    """What a JSON-like value holds where; never the text itself."""

    location: list[str | int]
    """Keys and indexes from the value's root. A key that is itself a finding (or holds
    one) appears scrubbed, with NUL and surrogates escaped."""
    kind: str
    """``card number``, ``secret``, ``NUL byte`` or ``unpaired surrogate``."""
    detail: str = ""
    """Which secret (``Stripe secret key``, ``JWT``, …); empty for the other kinds."""
    in_key: bool = False
    """Whether the key at ``location`` is what was found, not the value under it."""


def looks_like_card_number(text: str) -> bool:
    """Whether ``text`` contains a Luhn-valid card number, however its digits are grouped."""
    return bool(_card_spans(text))


def looks_like_secret(text: str) -> bool:
    """Whether ``text`` contains a recognisable credential (API key, token, private key,
    password assignment)."""
    return next(_secret_matches(text), None) is not None


def secret_kind(text: str) -> str | None:
    """Which credential ``text`` contains first (``"Stripe secret key"``, …), if any."""
    found = next(_secret_matches(text), None)
    return None if found is None else found.what


def scrub(text: str) -> str:
    """``text`` with card numbers and recognisable secrets replaced by a marker."""
    removed = [found.removed for found in _secret_matches(text)]
    for start, end in reversed(removed):
        text = text[:start] + SECRET_REMOVED + text[end:]
    for start, end in reversed(_card_spans(text)):
        text = text[:start] + CARD_NUMBER_REMOVED + text[end:]
    return text


def sensitive_locations(value: Any) -> list[Finding]:
    """Where in a JSON-like value a string (a key too) holds a card number or a secret.

    Integers are read as their digits (a card number sent as a JSON number), and a string
    under a key named like a credential (``password``, ``api_key``, ``clientSecret``) is a
    secret unless it is empty, masked or a placeholder.
    """
    found: list[Finding] = []
    for location, text, in_key, key_name in _texts(value):
        if looks_like_card_number(text):
            found.append(Finding(_shown(location), "card number", in_key=in_key))
        elif (what := secret_kind(text)) is not None:
            found.append(Finding(_shown(location), "secret", what, in_key=in_key))
        elif not in_key and key_name and _names_credential(key_name) and _is_assigned_value(text):
            found.append(
                Finding(_shown(location), "secret", "value of a field named like a credential")
            )
    return found


def unstorable_locations(value: Any) -> list[Finding]:
    """Where in a JSON-like value a string (a key too) holds NUL or a surrogate code point:
    PostgreSQL refuses the first, every UTF-8 encoder the second."""
    found: list[Finding] = []
    for location, text, in_key, _ in _texts(value):
        if isinstance(text, str) and (char := _UNSTORABLE.search(text)) is not None:
            kind = "NUL byte" if char.group() == "\x00" else "unpaired surrogate"
            found.append(Finding(_shown(location), kind, in_key=in_key))
    return found


def _names_credential(key: str) -> bool:
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).replace("-", "_")
    return len(words) <= 100 and _CREDENTIAL_KEY.fullmatch(words) is not None


def _shown(location: list[str | int]) -> list[str | int]:
    """A location as a finding names it: each key as ``_shown_key`` shows it."""
    return [_shown_key(part) if isinstance(part, str) else part for part in location]


def _shown_key(key: str) -> str:
    """A key as a refusal may name it: scrubbed, NUL and surrogates escaped."""
    if _UNSTORABLE.search(key):
        key = key.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00")
    return scrub(key)


def _texts(value: Any) -> Iterator[tuple[list[str | int], str, bool, str]]:
    """Every string of a JSON-like value, keys included, and every integer's digits, in
    document order: ``(location, text, is a key, the key it is under)``. Iterative, so
    nesting depth is bounded by memory, not by the recursion limit. The location holds
    the keys as sent: only a finding's is scrubbed (``_shown``), since scrubbing every
    key of every request was about half of what the scans cost."""
    # (location, item, the key it is under, whether the item is that key itself)
    stack: list[tuple[list[str | int], Any, str, bool]] = [([], value, "", False)]
    while stack:
        location, item, key_name, is_key = stack.pop()
        if isinstance(item, str):
            yield location, item, is_key, key_name
        elif isinstance(item, int) and not isinstance(item, bool):
            yield location, str(abs(item)), False, key_name
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                key = str(key)
                at = [*location, key]
                stack += [(at, child, key, False), (at, key, "", True)]
        elif isinstance(item, list | tuple):
            items = [([*location, index], child, "", False) for index, child in enumerate(item)]
            stack.extend(reversed(items))
