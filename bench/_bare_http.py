"""The gateway path's baseline: a FastAPI endpoint that runs one bare workflow and waits.

``python -m bench._bare_http TEMPORAL_ADDRESS TASK_QUEUE`` serves ``POST
/v1/bare/calls`` on a free port of 127.0.0.1 through the gateway's own uvicorn set-up
(``HttpServer``, as ``onceflow gateway`` serves), prints ``bare http endpoint ready on
URL``, and serves until SIGTERM or SIGINT. Each request validates its JSON body with a
pydantic model, starts ``BareWorkflow`` (one no-op activity, ``maximum_attempts=1``) on
a plain client, waits for its result and answers it: the web framework and Temporal,
with no authentication, claim, fingerprint, tracing or outcome record. The workflow runs
on ``python -m bench._bare_worker``.
"""

import asyncio
import os
import sys
import uuid

from pydantic import BaseModel
from temporalio.client import Client

from bench._bare import BareWorkflow

READY = "bare http endpoint ready on "


class BareRequest(BaseModel):
    """The same body as the gateway arm's ``issue_coupon`` call."""

    user_id: str
    coupon_id: str


class BareAnswer(BaseModel):
    workflow_id: str
    result: str


async def serve(address: str, task_queue: str) -> None:
    from fastapi import FastAPI

    from onceflow.gateway.http_server import HttpServer

    client = await Client.connect(address)
    app = FastAPI()

    @app.post("/v1/bare/calls")
    async def call(body: BareRequest) -> BareAnswer:
        workflow_id = f"bare-{uuid.uuid4().hex}"
        result = await client.execute_workflow(
            BareWorkflow.run, body.user_id, id=workflow_id, task_queue=task_queue
        )
        return BareAnswer(workflow_id=workflow_id, result=result)

    server = HttpServer(app, host="127.0.0.1", port=0)
    print(f"{READY}{await server.start()} (pid {os.getpid()})", flush=True)
    await server.wait()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], sys.argv[2]))
