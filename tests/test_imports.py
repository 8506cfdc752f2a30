"""Importing onceflow reads nothing: no environment variable, no configuration file.

Each entry point loads the configuration once and passes it down; a module that read a
setting at import would make what a workflow decides depend on the process that happens
to import it. The probe imports every module of the three distributions in a fresh
interpreter with an empty environment and an ``os.environ`` that reports every read made
by module-level code of ours, and with a configuration file that is wrong on purpose, so
a read at import would also fail loudly.
"""

import subprocess
import sys
from pathlib import Path

from .conftest import repo_root

PROBE = r"""
import importlib, os, pkgutil, sys
from collections.abc import MutableMapping

ours = tuple(str(p) for p in sys.argv[1:])
SETTINGS = ("ONCEFLOW_", "DATABASE_URL", "STRIPE_", "SMTP_", "DEPLOY_", "TEMPORAL_", "OTEL_")
reads = []

class Watched(MutableMapping):
    def __init__(self, real):
        self._real = real
    def _note(self, name):
        # A library's own switches (PYDANTIC_DISABLE_PLUGINS while a model class is made)
        # are not settings; ours, the standard ones we honour, or a scan of them all are.
        if not name.startswith(SETTINGS) and name != "(every variable)":
            return
        frame = sys._getframe(2)
        # The innermost module body running decides: ours is a read at our import; a
        # library's is that library reading at its own import, which is not ours to fix.
        while frame is not None:
            if frame.f_code.co_name == "<module>":
                path = frame.f_code.co_filename
                if path.startswith(ours):
                    reads.append(f"{name} read at import by {path}:{frame.f_lineno}")
                break
            frame = frame.f_back
    def __getitem__(self, name):
        self._note(name)
        return self._real[name]
    def __setitem__(self, name, value):
        self._real[name] = value
    def __delitem__(self, name):
        del self._real[name]
    def __iter__(self):
        self._note("(every variable)")
        return iter(self._real)
    def __len__(self):
        return len(self._real)
    def copy(self):
        self._note("(every variable)")
        return dict(self._real)

os.environ = Watched(os.environ)
imported = 0
for package in ("onceflow", "onceflow_client", "onceflow_devstack"):
    root = importlib.import_module(package)
    imported += 1
    for module in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        if module.name.endswith("__main__"):
            continue
        importlib.import_module(module.name)
        imported += 1
print(f"imported {imported} modules")
print("\n".join(reads))
"""


def test_every_module_imports_with_an_empty_environment_and_reads_no_setting(
    tmp_path: Path,
) -> None:
    broken = tmp_path / "onceflow.toml"
    broken.write_text("this is not = toml [\n")
    roots = [
        repo_root() / "onceflow",
        repo_root() / "client" / "onceflow_client",
        repo_root() / "devstack" / "onceflow_devstack",
    ]
    ran = subprocess.run(
        [sys.executable, "-c", PROBE, *map(str, roots)],
        cwd=tmp_path,
        # Nothing of onceflow's: only what an interpreter needs to start. The broken file
        # and the bad value would make any import-time read fail.
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "ONCEFLOW_CONFIG": str(broken),
            "ONCEFLOW_PAYMENTS_KEY_RETENTION": "not a duration",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    imported, *reads = ran.stdout.strip().splitlines()
    assert int(imported.split()[1]) > 100, imported
    assert reads == [], "\n".join(reads)
