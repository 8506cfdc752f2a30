"""The one typed configuration of a onceflow process, read and checked as a whole at start-up.

``load_configuration`` reads every settings section (environment variables over the
``ONCEFLOW_CONFIG`` file over defaults, see ``settings``): the sections every process
shares, typed here, and the sections of every tool family the process loads (onceflow's
own, ``BUILTIN_FAMILIES``, and the custom ones of ``[onceflow] tools``), so their tables
are known. It refuses unknown tables and keys, and reports every problem of every section
in one ``InvalidSettings``, one line each. A family reads its sections from the result
(``OnceflowConfiguration.read``). It lives apart from ``settings`` because it imports the
tool modules, which import ``settings``.
"""

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict

from onceflow.encryption import PayloadEncryptionSettings
from onceflow.gateway import GatewaySettings, RetentionTooShort, check_retention
from onceflow.settings import (
    FileBackedSettings,
    InvalidSettings,
    OnceflowSettings,
    ProcessSettings,
    SettingsReader,
    declared_settings_classes,
    read_settings,
)

AnySettings = TypeVar("AnySettings", bound=FileBackedSettings)

BUILTIN_FAMILIES = (
    "onceflow.coupons:coupon_family",
    "onceflow.orders:order_family",
    "onceflow.payments:payment_family",
    "onceflow.email:email_family",
    "onceflow.deployments:deployment_family",
)
"""onceflow's own tool families, in catalogue order, named as ``ONCEFLOW_TOOLS`` names a
user's; ``[onceflow] builtin_tools`` chooses which of their tools a deployment serves."""


class OnceflowConfiguration(BaseModel):
    """Every settings section of a process; ``load_configuration`` builds it.

    The sections every process shares are typed fields; a tool family's (onceflow's own:
    ``[stripe]``, ``[tools.payments]``, ``[email]``, ``[tools.email]``,
    ``[deploy_target]``, ``[tools.deployments]``; a custom family's: ``[tools.ledgerpay]``,
    …) are read with ``read(StripeSettings)``.
    """

    model_config = ConfigDict(frozen=True)

    onceflow: OnceflowSettings
    """``[onceflow]`` and ``ONCEFLOW_*``, ``DATABASE_URL``: shared by every process."""
    gateway: GatewaySettings
    """``[gateway]`` and ``ONCEFLOW_GATEWAY_*``: the boundary's records and quotas."""
    payload_encryption: PayloadEncryptionSettings
    """``[payload_encryption]`` and ``ONCEFLOW_PAYLOAD_KEYS``, ``ONCEFLOW_UI_ORIGIN``: the
    same keys in every process that talks to Temporal."""
    tool_sections: tuple[FileBackedSettings, ...] = ()
    """The sections of the tool families, read and checked with the others. Default none
    (``read`` then reads a family's section when asked)."""
    config_file: Path | None = None
    """The file the sections were read from (``ONCEFLOW_CONFIG``). Default: none."""

    def read(self, settings_class: type[AnySettings]) -> AnySettings:
        """The section of ``settings_class``: the one this configuration holds, else read
        as ``read_settings`` reads it. What a tool family gets to read its settings from
        (``onceflow.settings.SettingsSource``), so a family sees the values the rest of
        the process checked, or was given (``with_sections``)."""
        for _, section in self.sections():
            if type(section) is settings_class:
                assert isinstance(section, settings_class)
                return section
        return read_settings(settings_class)

    def with_sections(self, *sections: FileBackedSettings) -> "OnceflowConfiguration":
        """This configuration with ``sections`` in place of those of the same class (the
        dev stack points the built-in families at its far sides this way)."""
        fields: dict[str, FileBackedSettings] = {}
        others: list[FileBackedSettings] = []
        for section in sections:
            name = next(
                (
                    name
                    for name in type(self).model_fields
                    if type(getattr(self, name)) is type(section)
                ),
                None,
            )
            if name is None:
                others.append(section)
            else:
                fields[name] = section
        replacing = {type(section): section for section in others}
        kept = tuple(replacing.pop(type(section), section) for section in self.tool_sections)
        return self.model_copy(update={**fields, "tool_sections": (*kept, *replacing.values())})

    def sections(self) -> Iterator[tuple[str, FileBackedSettings]]:
        """Each section with the name of its table in the file: the shared ones in
        declaration order, then the tool families'."""
        for name in type(self).model_fields:
            section = getattr(self, name)
            if isinstance(section, FileBackedSettings):
                yield section.config_table, section
        for section in self.tool_sections:
            yield section.config_table, section


def load_configuration() -> OnceflowConfiguration:
    """Read and check every section; raises ``InvalidSettings`` listing every problem."""
    reader = SettingsReader()
    sections: dict[str, FileBackedSettings | None] = {}
    for name, field in OnceflowConfiguration.model_fields.items():
        section_class = field.annotation
        if isinstance(section_class, type) and issubclass(section_class, FileBackedSettings):
            sections[name] = reader.read(section_class)
    packages = {_package_of(spec) for spec in BUILTIN_FAMILIES}
    for package in packages:
        importlib.import_module(package)  # declares the families' settings classes
    onceflow = sections["onceflow"]
    if isinstance(onceflow, OnceflowSettings) and onceflow.tools:
        problems, custom = _custom_tool_problems(onceflow.tools)
        reader.problems.extend(problems)
        packages |= custom
    # The families' settings are checked now too, so a bad value stops every process at
    # start, not the first attempt.
    tool_sections = [
        reader.read(settings_class)
        for settings_class in declared_settings_classes()
        if any(_within(settings_class.__module__, package) for package in packages)
    ]
    reader.check_file()  # after loading custom tools: only then are their tables known
    gateway = sections["gateway"]
    if isinstance(gateway, GatewaySettings):
        try:
            check_retention(gateway)
        except RetentionTooShort as too_short:
            reader.problems.append(f"{too_short}; fix: raise it above the window")
    reader.raise_problems()
    return OnceflowConfiguration.model_validate(
        {
            **sections,
            "tool_sections": tuple(tool_sections),
            "config_file": reader.config.path if reader.config else None,
        }
    )


def _package_of(spec: str) -> str:
    return spec.partition(":")[0]


def _custom_tool_problems(specs: tuple[str, ...]) -> tuple[list[str], set[str]]:
    """Import the custom tools (not registering them), so their settings classes and tables
    are known; a tool that cannot be loaded is a problem of ``[onceflow] tools``. Also
    returns the packages the tools come from."""
    from onceflow.tools import ToolRegistrationError
    from onceflow.tools.worker import load_tools

    try:
        # Their families read the process's sections afresh: the configuration that
        # would answer them is the one being checked.
        tools = load_tools(specs, ProcessSettings())
    except InvalidSettings as invalid:
        return list(invalid.problems), set()
    except ToolRegistrationError as refused:
        return [" ".join(str(refused).split())], set()
    modules = {tool.perform.__module__ for tool in tools}
    return [], {module.rpartition(".")[0] or module for module in modules}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")
