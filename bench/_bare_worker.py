"""A worker process that runs only the bare baseline workflows (for the memory and the
one-step task benchmarks).

``python -m bench._bare_worker TEMPORAL_ADDRESS TASK_QUEUE`` polls until SIGTERM; it
prints ``bare worker ready`` once polling, so the benchmark measures the same kind of
process as ``onceflow worker``: one Python process, one Temporal worker.
"""

import asyncio
import signal
import sys

from temporalio.client import Client
from temporalio.worker import Worker

from bench._bare import BareWaitingWorkflow, BareWorkflow, no_op


async def serve(address: str, task_queue: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    client = await Client.connect(address)
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[BareWorkflow, BareWaitingWorkflow],
        activities=[no_op],
    ):
        print("bare worker ready", flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], sys.argv[2]))
