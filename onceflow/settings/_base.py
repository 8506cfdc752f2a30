"""``FileBackedSettings``: a settings class reading the environment, then its table of
the configuration file; every subclass is recorded by the table it reads."""

import re
from typing import Any, ClassVar

from pydantic import AliasChoices
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from onceflow.settings._file import read_config_file

_TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")


TABLES: dict[str, list[type["FileBackedSettings"]]] = {}
"""Every settings class defined in this process, by the table it reads."""


def declared_settings_classes() -> list[type["FileBackedSettings"]]:
    """Every ``FileBackedSettings`` subclass defined in this process so far."""
    return [settings_class for classes in TABLES.values() for settings_class in classes]


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

        from collections.abc import AsyncIterator
        from contextlib import asynccontextmanager
        from datetime import timedelta

        from pydantic import Field, SecretStr
        from pydantic_settings import SettingsConfigDict

        from onceflow.settings import FileBackedSettings, read_settings


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


        @asynccontextmanager
        async def open_slack() -> AsyncIterator[SlackClient]:
            # Read when the worker opens the client, never at import.
            settings = read_settings(SlackToolSettings)
            ...

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
        TABLES.setdefault(table, []).append(cls)

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
            keys = input_keys(name, field)
            # A higher source may have used another alias of the same field; skipping the
            # field keeps its value from being overridden by the file's.
            if name in table and not any(key in self.current_state for key in keys):
                values[keys[0]] = table[name]
        return values


def input_keys(field_name: str, field: FieldInfo) -> tuple[str, ...]:
    """The keys a field is validated from: its aliases (the preferred first), its name."""
    aliases: list[str] = []
    for alias in (field.alias, field.validation_alias):
        if isinstance(alias, str):
            aliases.append(alias)
        elif isinstance(alias, AliasChoices):
            aliases.extend(choice for choice in alias.choices if isinstance(choice, str))
    return tuple(dict.fromkeys([*aliases, field_name]))
