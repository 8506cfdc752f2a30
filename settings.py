"""onceflow's process settings: the environment, then an optional TOML file, then defaults.

Every settings class derives from ``FileBackedSettings`` and names the table of the
configuration file it reads (``[onceflow]``, ``[stripe]``, ``[tools.payments]``, …). A value
comes from, first match wins: keyword arguments, environment variables, that table of the
file named by ``ONCEFLOW_CONFIG`` (no file when it is not set; nothing is looked up
implicitly), the field's default. ``read_settings`` (one class) and ``SettingsReader``
(several, one report) turn every problem into ``InvalidSettings``, one line per problem
naming the environment variable, the file key and the fix, and never echoing a value::

    ValueError
    └── InvalidSettings             a bad value, an unknown key or table, a missing or
        │                           broken file; ``problems`` holds one line each
        └── gateway.InvalidGatewaySettings

Temporal's own connection settings (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``,
``TEMPORAL_API_KEY``, TLS, profile file) are read by ``temporalio.envconfig``, not here.
"""

import difflib
import json
import os
import re
import tomllib
import types
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar, Union, cast, get_args, get_origin

from pydantic import AliasChoices, Field, SecretBytes, SecretStr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticUndefined, to_jsonable_python
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

CONFIG_FILE_VARIABLE = "ONCEFLOW_CONFIG"
"""Environment variable naming the configuration file (``onceflow --config`` sets it)."""

_TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
_SECRET_WORDS = ("secret", "password", "passwd", "token")
_URL_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:/@]*):[^@/]*@")


class InvalidSettings(ValueError):
    """A setting (environment variable or configuration file) onceflow cannot use.

    ``problems`` holds one line per problem; the message is those lines.
    """

    def __init__(self, *problems: str) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class ConfigFile:
    """The configuration file named by ``ONCEFLOW_CONFIG``, parsed."""

    path: Path
    """The file, as ``ONCEFLOW_CONFIG`` names it."""
    document: Mapping[str, Any]
    """Its parsed TOML."""

    def table(self, name: str) -> Mapping[str, Any] | None:
        """The table ``name`` (dotted, e.g. ``tools.payments``), or None if absent."""
        node: Any = self.document
        for part in name.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node if isinstance(node, dict) else None


def config_file_path() -> Path | None:
    """The file ``ONCEFLOW_CONFIG`` names, or None when it is not set (no implicit lookup)."""
    named = os.environ.get(CONFIG_FILE_VARIABLE, "").strip()
    return Path(named) if named else None


def read_config_file() -> ConfigFile | None:
    """Parse the configuration file; a missing, unreadable or broken one is ``InvalidSettings``."""
    path = config_file_path()
    if path is None:
        return None
    fix = f"fix: point {CONFIG_FILE_VARIABLE} (or --config) at a TOML file, or unset it"
    try:
        with path.open("rb") as stream:
            document = tomllib.load(stream)
    except FileNotFoundError:
        raise InvalidSettings(f"config file {path} does not exist; {fix}") from None
    except tomllib.TOMLDecodeError as broken:
        # tomllib's messages name a position and sometimes a key, never a value.
        raise InvalidSettings(
            f"config file {path} is not valid TOML: {broken}; fix: correct the file there"
        ) from None
    except UnicodeDecodeError as undecodable:
        raise InvalidSettings(
            f"config file {path} is not UTF-8 text (byte {undecodable.start}); "
            "fix: save it as UTF-8"
        ) from None
    except OSError as unreadable:
        raise InvalidSettings(
            f"config file {path} cannot be read: {unreadable.strerror or unreadable}; {fix}"
        ) from None
    return ConfigFile(path, document)


_TABLES: dict[str, list[type["FileBackedSettings"]]] = {}
"""Every settings class defined in this process, by the table it reads."""


def declared_settings_classes() -> list[type["FileBackedSettings"]]:
    """Every ``FileBackedSettings`` subclass defined in this process so far."""
    return [settings_class for classes in _TABLES.values() for settings_class in classes]


class FileBackedSettings(BaseSettings):
    """Settings read from the environment and from one table of the configuration file.

    A subclass names its table in ``config_table`` and its environment variables as any
    pydantic-settings class does (``env_prefix``, aliases). Sources, first match wins:
    keyword arguments, environment variables, the table in the file named by
    ``ONCEFLOW_CONFIG``, the field's default. Keys of the table are the field names. Read
    it with ``read_settings``: a key the table does not know, a table no class reads, or a
    bad value is refused with one line per problem, naming the variable, the file key and
    the fix. Environment variables unrelated to the class are ignored.

    A custom tool's settings go under ``[tools.<tool>]``::

        from datetime import timedelta

        from pydantic import Field, SecretStr
        from pydantic_settings import SettingsConfigDict

        from settings import FileBackedSettings, read_settings


        class SlackToolSettings(FileBackedSettings):
            \"\"\"How ``post_to_slack`` reaches Slack; read from ``ONCEFLOW_SLACK_*``.\"\"\"

            config_table = "tools.slack"
            model_config = SettingsConfigDict(
                env_prefix="ONCEFLOW_SLACK_", extra="ignore", frozen=True
            )

            bot_token: SecretStr | None = None
            \"\"\"Bot token (``ONCEFLOW_SLACK_BOT_TOKEN``). Default: none.\"\"\"
            attempt_timeout: timedelta = Field(default=timedelta(seconds=30), gt=timedelta(0))
            \"\"\"Longest one attempt may run. Default 30 s.\"\"\"


        SLACK_TOOL_SETTINGS = read_settings(SlackToolSettings)

    with, in the file::

        [tools.slack]
        attempt_timeout = "PT45S"
    """

    config_table: ClassVar[str]
    """The table of the configuration file this class reads, dotted for nested tables
    (``tools.slack`` is ``[tools.slack]``). Required in every subclass."""

    model_config = SettingsConfigDict(extra="ignore")

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        table = getattr(cls, "config_table", None)
        if not isinstance(table, str) or not _TABLE_NAME.match(table):
            raise TypeError(
                f"{cls.__qualname__} must set config_table to the name of its table in the "
                "configuration file, e.g. config_table = 'tools.my_tool'"
            )
        _TABLES.setdefault(table, []).append(cls)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            env_settings,
            dotenv_settings,
            file_secret_settings,
            _ConfigFileSource(settings_cls, cls.config_table),
        )


class _ConfigFileSource(PydanticBaseSettingsSource):
    """One table of the configuration file, below every other source."""

    def __init__(self, settings_cls: type[BaseSettings], table: str) -> None:
        super().__init__(settings_cls)
        self.table = table

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads the whole table at once

    def __call__(self) -> dict[str, Any]:
        config = read_config_file()
        table = config.table(self.table) if config is not None else None
        if not table:
            return {}
        values: dict[str, Any] = {}
        for name, field in self.settings_cls.model_fields.items():
            keys = _input_keys(name, field)
            # A higher source may have used another alias of the same field; skipping the
            # field keeps its value from being overridden by the file's.
            if name in table and not any(key in self.current_state for key in keys):
                values[keys[0]] = table[name]
        return values


AnySettings = TypeVar("AnySettings", bound=FileBackedSettings)


_collected_problems: ContextVar[list[str] | None] = ContextVar("_collected_problems", default=None)


def read_settings(settings_class: type[AnySettings]) -> AnySettings:
    """Read one settings class; every problem (its table's unknown keys included) raises
    one ``InvalidSettings``, never a validation traceback.

    Inside ``settings_problems_collected`` the problems are recorded instead and the
    defaults returned, for the block to report them with all others.
    """
    try:
        reader = SettingsReader()
        reader.check_table(settings_class.config_table)
        settings = reader.read(settings_class)
        reader.raise_problems()
    except InvalidSettings as invalid:
        collected = _collected_problems.get()
        if collected is None:
            raise
        collected.extend(invalid.problems)
        return cast(AnySettings, settings_class.model_construct())
    assert settings is not None  # raise_problems raised otherwise
    return settings


@contextmanager
def settings_problems_collected() -> Iterator[list[str]]:
    """Report the problems of every settings read in the block together.

    Inside the block ``read_settings`` records its problems (in the yielded list) and
    returns the defaults instead of raising; leaving the block raises one
    ``InvalidSettings`` with every problem recorded or raised in it. For start-up code
    importing modules that read settings at import (the tools), so that a bad value in one
    does not hide the problems of the others. Nothing read in a block that raises may be
    used.
    """
    problems: list[str] = []
    token = _collected_problems.set(problems)
    try:
        yield problems
    except InvalidSettings as invalid:
        problems.extend(invalid.problems)
    finally:
        _collected_problems.reset(token)
    if problems:
        raise InvalidSettings(*dict.fromkeys(problems))


class SettingsReader:
    """Reads several settings classes against one configuration file, gathering every
    problem of every class so that one ``InvalidSettings`` reports them all.

    A missing or broken file raises at once: nothing else can be judged without it.
    """

    def __init__(self) -> None:
        self.config = read_config_file()
        self.problems: list[str] = []

    def check_file(self) -> None:
        """Refuse unknown tables, and unknown keys of every table, in the whole file.

        A table is known once a ``FileBackedSettings`` class reading it is defined: load
        custom tools before calling this.
        """
        if self.config is not None:
            self.problems.extend(_document_problems(self.config))

    def check_table(self, table: str) -> None:
        """Refuse keys of ``table`` that no class reading it knows."""
        if self.config is not None and self.config.table(table) is not None:
            self.problems.extend(_table_problems(self.config, table))

    def read(self, settings_class: type[AnySettings]) -> AnySettings | None:
        """The settings, or None after recording why they cannot be read."""
        try:
            return settings_class()
        except ValidationError as invalid:
            self.problems.extend(
                _describe(settings_class, problem, self.config)
                for problem in invalid.errors(include_input=False, include_url=False)
            )
        except SettingsError as unparsable:
            self.problems.append(_describe_unparsable(settings_class, unparsable))
        return None

    def raise_problems(self) -> None:
        """Raise ``InvalidSettings`` with every problem found, if any."""
        if self.problems:
            raise InvalidSettings(*dict.fromkeys(self.problems))


class OnceflowSettings(FileBackedSettings):
    """Settings shared by the worker, the CLI and the dev stack (``[onceflow]``)."""

    config_table = "onceflow"
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_", extra="ignore")

    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    """PostgreSQL URL (``DATABASE_URL``). Default: the embedded server of ``onceflow dev``."""
    task_queue: str = "onceflow-tasks"
    """Task queue of the task workflows and their activities. Default ``onceflow-tasks``."""
    state_dir: Path = Path(".onceflow")
    """Where the embedded stack keeps its data and pid files. Default ``./.onceflow``."""
    shutdown_grace_seconds: float = Field(default=30.0, ge=0, le=3600)
    """How long a stopping worker lets running activities finish
    (``ONCEFLOW_SHUTDOWN_GRACE_SECONDS``). Default 30."""
    db_pool_max_size: int = Field(default=10, ge=1, le=200)
    """Most database connections one worker process holds. Default 10."""
    parked_scan_seconds: float = Field(default=30.0, gt=0, le=3600)
    """How often a worker that exports metrics counts parked tasks in Temporal's
    visibility store for the parked-task gauges (``ONCEFLOW_PARKED_SCAN_SECONDS``).
    Default 30."""
    tools: Annotated[tuple[str, ...], NoDecode] = ()
    """Custom tools to register, each an entry point name in the ``onceflow.tools`` group
    or an import path ``package.module:ATTRIBUTE``. Default none.

    ``ONCEFLOW_TOOLS`` is comma-separated (``a, b``); the file holds an array
    (``tools = ["a", "b"]``)."""

    @field_validator("tools", mode="before")
    @classmethod
    def _split_comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value


def load_settings() -> OnceflowSettings:
    """onceflow's own settings (see ``read_settings``)."""
    return read_settings(OnceflowSettings)


def is_secret_setting(name: str, field: FieldInfo) -> bool:
    """Whether a field holds a secret whose value is never shown: typed ``SecretStr`` (or
    ``SecretBytes``), or named like one (``…key``, ``…secret…``, ``…password…``, ``…token…``).

    Only a trailing ``key`` counts, so ``key_retention`` or ``default_key_quota`` are shown.
    """
    lowered = name.lower()
    return (
        _holds_secret_type(field.annotation)
        or lowered.endswith("key")
        or any(word in lowered for word in _SECRET_WORDS)
    )


def mask_url_password(value: str) -> str:
    """``scheme://user:***@host…`` for a URL that carries a password; other text unchanged."""
    return _URL_PASSWORD.sub(r"\1:***@", value)


def environment_variables(settings_class: type[BaseSettings], field_name: str) -> tuple[str, ...]:
    """The environment variables that set a field, the documented one first."""
    field = settings_class.model_fields[field_name]
    config = settings_class.model_config
    aliases = [key for key in _input_keys(field_name, field) if key != field_name]
    documented = [alias.upper() for alias in aliases if alias.isupper()]
    prefixed = []
    if not aliases or config.get("populate_by_name") or config.get("validate_by_name"):
        prefixed.append(f"{config.get('env_prefix', '')}{field_name}".upper())
    others = [alias.upper() for alias in aliases if not alias.isupper()]
    return tuple(dict.fromkeys([*documented, *prefixed, *others]))


def _holds_secret_type(annotation: Any) -> bool:
    if annotation in (SecretStr, SecretBytes):
        return True
    if get_origin(annotation) in (Union, types.UnionType, Annotated):
        return any(_holds_secret_type(argument) for argument in get_args(annotation))
    return False


def _input_keys(field_name: str, field: FieldInfo) -> tuple[str, ...]:
    """The keys a field is validated from: its aliases (the preferred first), its name."""
    aliases: list[str] = []
    for alias in (field.alias, field.validation_alias):
        if isinstance(alias, str):
            aliases.append(alias)
        elif isinstance(alias, AliasChoices):
            aliases.extend(choice for choice in alias.choices if isinstance(choice, str))
    return tuple(dict.fromkeys([*aliases, field_name]))


def _field_of(settings_class: type[BaseSettings], key: int | str) -> str | None:
    for name, field in settings_class.model_fields.items():
        if key in _input_keys(name, field):
            return name
    return None


def _describe(
    settings_class: type[FileBackedSettings], problem: ErrorDetails, config: ConfigFile | None
) -> str:
    """One line: which setting, where it came from, what is wrong, the fix. No value."""
    table = settings_class.config_table
    message = " ".join(problem["msg"].split())
    location = problem["loc"]
    field_name = _field_of(settings_class, location[0]) if location else None
    if field_name is None:  # a check across several fields
        prefix = str(settings_class.model_config.get("env_prefix", "")).upper()
        return (
            f"invalid settings [{table}] ({prefix}*): {message}; fix: change the settings it names"
        )
    field = settings_class.model_fields[field_name]
    variables = environment_variables(settings_class, field_name)
    present = {name.upper() for name in os.environ}
    set_variable = next((name for name in variables if name in present), None)
    key = field_name + "".join(f"[{part}]" for part in location[1:])
    table_values = config.table(table) if config is not None else None
    if set_variable is not None:
        where, origin, removal = f"file key [{table}] {key}", set_variable, "unset it"
    elif table_values is not None and field_name in table_values:
        assert config is not None
        where, origin, removal = f"[{table}] {key} in {config.path}", variables[0], "remove it"
    else:
        where, origin, removal = f"[{table}] {key}", variables[0], "leave it out"
    if problem["type"] == "missing":
        return f"missing setting {origin} ({where}); fix: set {origin} or [{table}] {field_name}"
    return f"invalid setting {origin} ({where}): {message}; fix: set a value the message " + (
        f"allows, or {removal} to use the default{_default_text(field_name, field)}"
        if not field.is_required()
        else "allows"
    )


def _describe_unparsable(settings_class: type[FileBackedSettings], error: SettingsError) -> str:
    """pydantic-settings' own parse failure (a structured value that is not JSON)."""
    table = settings_class.config_table
    named = re.search(r'field "(\w+)"', str(error))
    field_name = named.group(1) if named else None
    if field_name is None or field_name not in settings_class.model_fields:
        return f"invalid settings [{table}]: {error}; fix: correct the value"
    variable = environment_variables(settings_class, field_name)[0]
    return (
        f"invalid setting {variable} (file key [{table}] {field_name}): cannot be parsed as "
        "JSON; fix: set a JSON value of the right shape, or unset it to use the default"
    )


def _default_text(field_name: str, field: FieldInfo) -> str:
    if field.default_factory is not None or field.default is PydanticUndefined:
        return ""
    if is_secret_setting(field_name, field):
        return ""  # even a secret's default is not shown
    value = to_jsonable_python(field.default)
    if value is None or value == []:
        return " (none)"
    return f" {json.dumps(value)}"  # strings quoted, booleans lower-case, as in the file


def _document_problems(config: ConfigFile) -> list[str]:
    """Unknown tables, and unknown keys of every known table, in the whole file."""
    problems: list[str] = []
    _walk(config, config.document, "", problems)
    return problems


def _walk(config: ConfigFile, node: Mapping[str, Any], prefix: str, problems: list[str]) -> None:
    for key, value in node.items():
        name = f"{prefix}.{key}" if prefix else key
        if name in _TABLES:
            if isinstance(value, dict):
                problems.extend(_table_problems(config, name))
            else:
                problems.append(
                    f"[{name}] in {config.path} is not a table; fix: write it as a [{name}] section"
                )
        elif isinstance(value, dict) and any(table.startswith(f"{name}.") for table in _TABLES):
            _walk(config, value, name, problems)
        elif isinstance(value, dict):
            problems.append(
                f"unknown table [{name}] in {config.path}; fix: "
                + _rename_or_remove(name, sorted(_TABLES), "tables", brackets=True)
            )
        elif prefix:
            problems.append(
                f"unknown setting [{prefix}] {key} in {config.path}; fix: "
                + _rename_or_remove(name, sorted(_TABLES), "tables", brackets=True)
            )
        else:
            homes = sorted(table for table, classes in _TABLES.items() if _knows(classes, key))
            problems.append(
                f"setting {key} in {config.path} is outside any table; fix: "
                + (
                    f"move it into [{homes[0]}]"
                    if len(homes) == 1
                    else "move it into its table, or remove it"
                )
            )


def _table_problems(config: ConfigFile, table: str) -> list[str]:
    """Keys of ``table`` that no class reading it knows (nested known tables excepted)."""
    values = config.table(table) or {}
    classes = _TABLES.get(table, [])
    known = sorted({name for settings_class in classes for name in settings_class.model_fields})
    problems: list[str] = []
    for key, value in values.items():
        if key in known:
            continue
        nested = f"{table}.{key}"
        if isinstance(value, dict) and any(
            other == nested or other.startswith(f"{nested}.") for other in _TABLES
        ):
            continue  # a table of its own, checked as such
        problems.append(
            f"unknown setting [{table}] {key} in {config.path}; fix: "
            + _rename_or_remove(key, known, f"settings of [{table}]", brackets=False)
        )
    return problems


def _knows(classes: Iterable[type[BaseSettings]], key: str) -> bool:
    return any(key in settings_class.model_fields for settings_class in classes)


def _rename_or_remove(name: str, known: list[str], what: str, *, brackets: bool) -> str:
    def shown(candidate: str) -> str:
        return f"[{candidate}]" if brackets else candidate

    nearest = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if nearest:
        return f"did you mean {shown(nearest[0])}? rename it, or remove it"
    return f"remove it (known {what}: {', '.join(shown(candidate) for candidate in known)})"
