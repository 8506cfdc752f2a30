"""The configuration on the command line: ``--config``, ``onceflow config check|show``, and the
check of every setting before a long-running command starts.

Registered on the main app by ``register``. ``--config`` must take effect before anything
reads settings, and the tool modules read theirs at import, before typer parses the
command line: ``preset_config_file`` finds it in the raw arguments first (``cli.run``).
"""

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

# Only light imports here: cli.run imports this module before anything reads settings.
from onceflow.settings import CONFIG_FILE_VARIABLE, is_secret_setting, mask_url_password

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


def preset_config_file(arguments: list[str]) -> None:
    """Set ``ONCEFLOW_CONFIG`` from a ``--config PATH`` (or ``--config=PATH``) given before
    the command, as typer would, but before any module reading settings is imported."""
    path = _config_argument(arguments)
    if path is not None:
        os.environ[CONFIG_FILE_VARIABLE] = _absolute(path)


def register(app: typer.Typer) -> None:
    """Add ``--config``, the start-up check and ``onceflow config`` to ``app``."""

    @app.callback()
    def configure(ctx: typer.Context, config: ConfigPath = None) -> None:
        # The option is parsed here only to appear in --help and to catch a path that came
        # too late: cli.run has already set it from the raw arguments.
        if config is not None and os.environ.get(CONFIG_FILE_VARIABLE) != _absolute(str(config)):
            from onceflow.cli._failures import CommandFailed

            raise CommandFailed(
                f"{_CONFIG_OPTION} came after settings were read; fix: run the onceflow "
                f"command (or python -m cli), or set {CONFIG_FILE_VARIABLE}",
                exit_code=2,
            )
        if ctx.invoked_subcommand in VALIDATED_AT_START and not _asks_for_help():
            from onceflow.configuration import load_configuration

            load_configuration()

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


def _config_argument(arguments: list[str]) -> str | None:
    for position, argument in enumerate(arguments):
        if argument == _CONFIG_OPTION:
            return arguments[position + 1] if position + 1 < len(arguments) else None
        if argument.startswith(f"{_CONFIG_OPTION}="):
            return argument.partition("=")[2]
        if argument == "--" or not argument.startswith("-"):
            return None  # the command: options after it are the command's own
    return None


def _absolute(path: str) -> str:
    return str(Path(path).expanduser().absolute())


def _asks_for_help() -> bool:
    # Typer parses the command's own --help only after this callback has run.
    return any(argument in ("--help", "-h") for argument in sys.argv[1:])
