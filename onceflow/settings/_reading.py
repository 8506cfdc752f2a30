"""Reading settings classes into values or into problems: one line per problem naming the
environment variable, the file key and the fix, never the value."""

import json
import os
import re
from typing import Protocol, TypeVar

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticUndefined, to_jsonable_python
from pydantic_settings import BaseSettings, SettingsError

from onceflow.settings._base import FileBackedSettings, input_keys
from onceflow.settings._file import ConfigFile, read_config_file
from onceflow.settings._file_checks import document_problems, table_problems
from onceflow.settings._invalid import InvalidSettings
from onceflow.settings._secrets import is_secret_setting

AnySettings = TypeVar("AnySettings", bound=FileBackedSettings)


def read_settings(settings_class: type[AnySettings]) -> AnySettings:
    """Read one settings class; every problem (its table's unknown keys included) raises
    one ``InvalidSettings``, never a validation traceback."""
    reader = SettingsReader()
    reader.check_table(settings_class.config_table)
    settings = reader.read(settings_class)
    reader.raise_problems()
    assert settings is not None  # raise_problems raised otherwise
    return settings


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
            self.problems.extend(document_problems(self.config))

    def check_table(self, table: str) -> None:
        """Refuse keys of ``table`` that no class reading it knows."""
        if self.config is not None and self.config.table(table) is not None:
            self.problems.extend(table_problems(self.config, table))

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


def environment_variables(settings_class: type[BaseSettings], field_name: str) -> tuple[str, ...]:
    """The environment variables that set a field, the documented one first."""
    field = settings_class.model_fields[field_name]
    config = settings_class.model_config
    aliases = [key for key in input_keys(field_name, field) if key != field_name]
    documented = [alias.upper() for alias in aliases if alias.isupper()]
    prefixed = []
    if not aliases or config.get("populate_by_name") or config.get("validate_by_name"):
        prefixed.append(f"{config.get('env_prefix', '')}{field_name}".upper())
    others = [alias.upper() for alias in aliases if not alias.isupper()]
    return tuple(dict.fromkeys([*documented, *prefixed, *others]))


def _field_of(settings_class: type[BaseSettings], key: int | str) -> str | None:
    for name, field in settings_class.model_fields.items():
        if key in input_keys(name, field):
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


class SettingsSource(Protocol):
    """Where a tool family reads its settings sections. The process's loaded configuration
    (``onceflow.OnceflowConfiguration``) is one: it answers with the sections it has
    checked, so a family built in a worker, a gateway or a test sees what the rest of that
    process sees; ``ProcessSettings`` reads each section afresh."""

    def read(self, settings_class: type[AnySettings]) -> AnySettings:
        """The section of ``settings_class``; raises ``InvalidSettings`` when it is wrong."""
        ...


class ProcessSettings:
    """A ``SettingsSource`` reading each section as ``read_settings`` does: the environment
    over the ``ONCEFLOW_CONFIG`` file over defaults."""

    def read(self, settings_class: type[AnySettings]) -> AnySettings:
        """``read_settings(settings_class)``."""
        return read_settings(settings_class)
