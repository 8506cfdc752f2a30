"""The client's framework extras install the framework, never the server.

An agent runtime installs ``onceflow-client[pydantic-ai]``: the client, httpx and
PydanticAI (slim). The client wheel is built offline from a copy of its sources; its
``Requires-Dist`` for the extra is read from the wheel, the extra's dependency closure is
resolved from the installed distributions' own metadata (markers evaluated, no index
asked), and the adapter is imported in an interpreter that sees nothing but the client
wheel and that closure.
"""

import email.parser
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from importlib.metadata import distribution, packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from ..conftest import repo_root

SERVER_ONLY = {
    "onceflow",
    "temporalio",
    "psycopg",
    "psycopg-binary",
    "psycopg-pool",
    "stripe",
    "fastapi",
    "uvicorn",
    "mcp",
}
"""What only the server (or the dev stack) installs."""


@pytest.fixture(scope="module")
def client_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The client's wheel, built with ``pip wheel`` from a copy of its sources."""
    sources = tmp_path_factory.mktemp("client-sources")
    shutil.copytree(
        repo_root() / "client",
        sources,
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
    )
    out = tmp_path_factory.mktemp("client-wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(out),
            str(sources),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = out.glob("*.whl")
    return wheel


def test_the_pydantic_ai_extra_requires_pydantic_ai_slim_and_no_server_package(
    client_wheel: Path,
) -> None:
    metadata = _metadata(client_wheel)
    assert "pydantic-ai" in (metadata.get_all("Provides-Extra") or [])
    extra = _extra_requirements(metadata, "pydantic-ai")
    assert [(req.name, str(req.specifier)) for req in extra] == [("pydantic-ai-slim", "<3,>=2.68")]

    closure = _closure({"httpx", *(req.name for req in extra)})

    assert "pydantic-ai-slim" in closure
    assert not closure & SERVER_ONLY, f"the extra pulls server packages: {closure & SERVER_ONLY}"


def test_the_pydantic_ai_adapter_imports_with_nothing_but_the_extra(
    client_wheel: Path, tmp_path: Path
) -> None:
    isolated = tmp_path / "site"
    zipfile.ZipFile(client_wheel).extractall(isolated)
    extra = _extra_requirements(_metadata(client_wheel), "pydantic-ai")
    for location in _locations(_closure({"httpx", *(req.name for req in extra)})):
        target = isolated / location.name
        if not target.exists():
            target.symlink_to(location)
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import onceflow_client; "
        "assert 'pydantic_ai' not in sys.modules, 'the client alone imported pydantic_ai'; "
        "from onceflow_client.pydantic_ai import OnceflowToolset; "
        "heavy = {'temporalio', 'psycopg', 'fastapi', 'stripe', 'onceflow', 'uvicorn', 'mcp'}; "
        "print(sorted(heavy & {name.split('.')[0] for name in sys.modules}))"
    )
    # -I -S: no site-packages, no user site, no PYTHONPATH: only the stdlib and the folder.
    ran = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe, str(isolated)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": os.environ.get("PATH", "")},
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]", "the adapter imported server code"


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        raw = archive.read(next(p for p in archive.namelist() if p.endswith("/METADATA")))
    return email.parser.BytesParser().parsebytes(raw)


def _extra_requirements(metadata: email.message.Message, extra: str) -> list[Requirement]:
    requirements = [Requirement(raw) for raw in metadata.get_all("Requires-Dist") or []]
    return [
        req
        for req in requirements
        if req.marker is not None
        and req.marker.evaluate({"extra": extra})
        and not req.marker.evaluate({"extra": ""})
    ]


def _closure(names: set[str]) -> set[str]:
    """The distributions ``names`` need, transitively, as installed here (no extras, markers
    evaluated for this interpreter)."""
    seen: set[str] = set()
    pending = list(names)
    while pending:
        name = _normalized(pending.pop())
        if name in seen:
            continue
        seen.add(name)
        for raw in distribution(name).requires or []:
            requirement = Requirement(raw)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return seen


def _locations(distributions: set[str]) -> Iterator[Path]:
    """Where the top-level modules of ``distributions`` live (a namespace package's one
    folder here holds every installed portion of it), and their metadata folders (some
    read their own version at import)."""
    for name in distributions:
        files = distribution(name).files or []
        metadata = next(file for file in files if file.name == "METADATA")
        yield Path(str(metadata.locate())).parent
    for module, owners in packages_distributions().items():
        if module.startswith("_") or not {_normalized(owner) for owner in owners} & distributions:
            continue
        spec = importlib.util.find_spec(module)
        assert spec is not None, module
        if spec.origin is not None and spec.origin not in ("namespace", "built-in", "frozen"):
            origin = Path(spec.origin)
            yield origin.parent if origin.name == "__init__.py" else origin
        else:
            yield from (Path(path) for path in spec.submodule_search_locations or [])


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
