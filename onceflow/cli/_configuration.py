"""The configuration on the command line: ``--config``, ``onceflow config check|show``, and the
one load of every setting before a long-running command starts.

Registered on the main app by ``register``. A command process reads its configuration
once (``loaded_configuration``) and passes its sections down; nothing reads settings at
import, so ``--config`` only has to be in place before the command body runs.
"""

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from onceflow.settings import CONFIG_FILE_VARIABLE, is_secret_setting, mask_url_password

if TYPE_CHECKING:
    from onceflow.configuration import OnceflowConfiguration

VALIDATED_AT_START = frozenset({"worker", "gateway", "mcp", "dev", "relay"})
"""Commands that check every setting before they start, so a bad one anywhere stops them."""

_CONFIG_OPTION = "--config"

ConfigPath = Annotated[
    Path | None,
    typer.Option(
        _CONFIG_OPTION,
        help=f"TOML configuration file (sets {CONFIG_FILE_VARIABLE}); environment variables "
        "override its values. Give it before the command.",
        dir_okay=False,
        show_default=False,
    ),
]


_loaded: "OnceflowConfiguration | None" = None
"""Read by ``loaded_configuration`` (a command is one process: one configuration)."""


def loaded_configuration() -> "OnceflowConfiguration":
    """This command's configuration: read and checked on first use, then the same object.

    Raises:
        InvalidSettings: Every problem of every section, one line each.
    """
    global _loaded
    if _loaded is None:
        from onceflow.activities import builtin_families
        from onceflow.configuration import load_configuration

        _loaded = load_configuration()
        # Every command scrubs what onceflow's families declare secret (a Stripe key in a
        # log line), whether or not it serves their tools. A family that refuses its
        # settings is reported by the commands that serve it, not by every command.
        with contextlib.suppress(ValueError):
            builtin_families(_loaded)
    return _loaded


def register(app: typer.Typer) -> None:
    """Add ``--config``, the start-up check and ``onceflow config`` to ``app``."""

    @app.callback()
    def configure(ctx: typer.Context, config: ConfigPath = None) -> None:
        if config is not None:
            # The file is named where every reader looks for it (settings and the
            # subprocesses a command starts alike).
            os.environ[CONFIG_FILE_VARIABLE] = _absolute(str(config))
        if ctx.invoked_subcommand in VALIDATED_AT_START and not _asks_for_help():
            loaded_configuration()

    config = typer.Typer(
        help=f"Check or show the settings (environment, {CONFIG_FILE_VARIABLE} file, defaults).",
        no_args_is_help=True,
    )

    @config.command("check")
    def check() -> None:
        """Check every setting; print 'configuration OK' and the file read, or each problem."""
        from onceflow.configuration import load_configuration

        loaded = load_configuration()
        source = (
            f"file {loaded.config_file}"
            if loaded.config_file is not None
            else f"no file ({CONFIG_FILE_VARIABLE} is not set)"
        )
        print(f"configuration OK; read the environment, {source} and defaults", flush=True)

    @config.command("show")
    def show() -> None:
        """Print the effective settings per table, as TOML; secrets show as ***."""
        from onceflow.configuration import load_configuration

        loaded = load_configuration()
        lines = [
            f"# file: {loaded.config_file}"
            if loaded.config_file is not None
            else f"# no file ({CONFIG_FILE_VARIABLE} is not set): environment and defaults"
        ]
        for table, section in loaded.sections():
            lines += ["", f"[{table}]"]
            values = section.model_dump(mode="json")
            for name, field in type(section).model_fields.items():
                lines.append(_toml_line(name, values[name], secret=is_secret_setting(name, field)))
        print("\n".join(lines), flush=True)

    app.add_typer(config, name="config")


def _toml_line(name: str, value: Any, *, secret: bool) -> str:
    if value is None:
        return f"# {name} is not set"
    if secret:
        return f'{name} = "***"'
    if isinstance(value, str):
        value = mask_url_password(value)
    # JSON's strings, numbers, booleans and arrays of them are TOML too.
    return f"{name} = {json.dumps(value)}"


def _absolute(path: str) -> str:
    return str(Path(path).expanduser().absolute())


def _asks_for_help() -> bool:
    # Typer parses the command's own --help only after this callback has run.
    return any(argument in ("--help", "-h") for argument in sys.argv[1:])
