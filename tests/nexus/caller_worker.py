"""The caller application's worker as a process of its own, for a test that kills it:
``python -m tests.nexus.caller_worker TASK_QUEUE`` (``TEMPORAL_ADDRESS`` in the
environment) prints ``CALLER_READY`` once it polls, and runs until it is stopped."""

import asyncio
import os
import sys

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from tests.nexus.callers import CancellingAgent, ChargingAgent, PlanningAgent

CALLER_READY = "caller worker ready"


async def main(task_queue: str) -> None:
    client = await Client.connect(
        os.environ["TEMPORAL_ADDRESS"], data_converter=pydantic_data_converter
    )
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[ChargingAgent, CancellingAgent, PlanningAgent],
    ):
        print(CALLER_READY, flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
