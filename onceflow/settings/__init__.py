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

from onceflow.settings._base import FileBackedSettings, declared_settings_classes
from onceflow.settings._file import (
    CONFIG_FILE_VARIABLE,
    ConfigFile,
    config_file_path,
    read_config_file,
)
from onceflow.settings._invalid import InvalidSettings
from onceflow.settings._onceflow import BUILTIN_TOOL_NAMES, OnceflowSettings, load_settings
from onceflow.settings._reading import (
    ProcessSettings,
    SettingsReader,
    SettingsSource,
    environment_variables,
    read_settings,
)
from onceflow.settings._secrets import is_secret_setting, mask_url_password

__all__ = [
    "BUILTIN_TOOL_NAMES",
    "CONFIG_FILE_VARIABLE",
    "ConfigFile",
    "FileBackedSettings",
    "InvalidSettings",
    "OnceflowSettings",
    "ProcessSettings",
    "SettingsReader",
    "SettingsSource",
    "config_file_path",
    "declared_settings_classes",
    "environment_variables",
    "is_secret_setting",
    "load_settings",
    "mask_url_password",
    "read_config_file",
    "read_settings",
]
