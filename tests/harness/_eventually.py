"""Waiting for what must happen: poll a read until its value says it happened.

``eventually`` is the only place a test or a benchmark polls; its interval is a polling
cadence, never a guess at how long something takes, and running out of time fails with
what never happened and the last value read.

How long a test waits is never sized to the work: every wait for something that must
happen is bounded by ``HANG_SECONDS``, which only tells a hang from slow progress (the
suite runs pinned to one core beside a busy one, where work takes many times longer).
"""

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

HANG_SECONDS = 180.0
"""The bound of every wait for something that must happen: far beyond what the work
takes on a loaded one-core machine, below the per-test timeout (240 s), so that a hang
fails naming what never happened. A wait that the work must beat is a test of the
machine's speed, not of onceflow."""

_SHOWN = 2000
"""How much of the last value a failure quotes."""


async def eventually(
    read: Callable[[], T] | Callable[[], Awaitable[T]],
    *,
    what: str | Callable[[], str],
    until: Callable[[T], object] = bool,
    timeout: float = HANG_SECONDS,
    interval: float = 0.05,
) -> T:
    """Read until ``until(value)`` holds, and return that value.

    Args:
        read: What to look at: a function, sync or async, returning the current value.
            An exception it raises ends the wait at once (use it for "the process died").
        what: What must happen, in words, for the failure message; or a function giving
            them when it fails (to quote a log as it is then).
        until: When the value means it happened. Default ``bool`` (a truthy value).
        timeout: Seconds before taking it for a hang. Default ``HANG_SECONDS``.
        interval: Seconds between reads. Default ``0.05``.

    Raises:
        AssertionError: It never happened within ``timeout``; names ``what`` and the last
            value read.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value: Any = read()
        if inspect.isawaitable(value):
            value = await value
        if until(value):
            return value  # type: ignore[no-any-return]
        if loop.time() >= deadline:
            raise _never(what, timeout, value)
        await asyncio.sleep(interval)  # eventually()'s polling cadence


def eventually_blocking(
    read: Callable[[], T],
    *,
    what: str | Callable[[], str],
    until: Callable[[T], object] = bool,
    timeout: float = HANG_SECONDS,
    interval: float = 0.05,
) -> T:
    """:func:`eventually` for code without an event loop (sync fixtures, threads)."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if until(value):
            return value
        if time.monotonic() >= deadline:
            raise _never(what, timeout, value)
        time.sleep(interval)  # eventually_blocking()'s polling cadence


def _never(what: str | Callable[[], str], timeout: float, last: object) -> AssertionError:
    if callable(what):
        what = what()
    shown = repr(last)
    if len(shown) > _SHOWN:
        shown = shown[:_SHOWN] + "..."
    return AssertionError(f"never happened within {timeout:g} s: {what}; last read: {shown}")
