"""The ``onceflow`` command line: the dev stack, workers, calls and operator decisions."""

import logging
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onceflow.configuration import OnceflowConfiguration


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: ``run``, then exit without interpreter teardown.

    Temporal's Rust client threads can outlive a command's event loop and abort the
    finalizing interpreter (temporalio/sdk-python#300), turning a clean exit into SIGABRT.
    Once a command has returned, everything it opened is closed, so leave at once.
    """
    try:
        run(argv)
        code = 0
    except SystemExit as leaving:
        if isinstance(leaving.code, str):
            sys.stderr.write(f"{leaving.code}\n")
        code = leaving.code if isinstance(leaving.code, int) else int(leaving.code is not None)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def loaded_configuration() -> "OnceflowConfiguration":
    """This command's configuration, read and checked on first use, then the same object
    (for the dev stack's commands, which run inside this CLI)."""
    from onceflow.cli._configuration import loaded_configuration as loaded

    return loaded()


def run(argv: list[str] | None = None) -> None:
    """Run one command (``argv`` defaults to the process's arguments)."""
    from onceflow.cli.main import run as run_app

    run_app(argv)
