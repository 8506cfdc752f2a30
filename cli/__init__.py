"""The ``onceflow`` command line: the dev stack, workers, calls and operator decisions."""

import sys


def run(argv: list[str] | None = None) -> None:
    """Console-script entry point: settings read while loading become one line too."""
    from settings import InvalidSettings

    try:
        from cli.main import run as run_app
    except InvalidSettings as invalid:
        sys.stderr.write(f"error: {invalid}\n")
        raise SystemExit(2) from None
    run_app(argv)
