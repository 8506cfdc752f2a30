"""``onceflow gateway``, held inside the claim→start window: the tests' fault injection.

Run as ``python -m tests.gateway.held_gateway --port 0``. Every new claim is followed by
a wait that never ends, so a test can kill the process between claim and start. The
product has no switch for this: the hold is injected here, through the boundary's
``after_claim`` seam.
"""

import asyncio
import sys
from collections.abc import Callable
from typing import Any

from onceflow import gateway
from onceflow.cli import main

HELD = "HELD after the claim, before the task starts"
"""The line printed once a claim is held."""


async def _hold_after_claim() -> None:
    print(HELD, flush=True)
    await asyncio.Event().wait()


def _holding(open_boundary: Callable[..., Any]) -> Callable[..., Any]:
    def open_held(*args: Any, **kwargs: Any) -> Any:
        return open_boundary(*args, after_claim=_hold_after_claim, **kwargs)

    return open_held


if __name__ == "__main__":
    gateway.open_boundary = _holding(gateway.open_boundary)  # type: ignore[assignment]
    main(["gateway", *sys.argv[1:]])
