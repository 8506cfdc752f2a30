"""The one typed configuration of a onceflow process, read and checked as a whole at start-up.

``load_configuration`` reads every settings section (environment variables over the
``ONCEFLOW_CONFIG`` file over defaults, see ``settings``), loads the custom tools of
``[onceflow] tools`` so their tables are known, refuses unknown tables and keys, and
reports every problem of every section in one ``InvalidSettings``, one line each. It lives
apart from ``settings`` because it imports the tool modules, which import ``settings``.
"""

from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from onceflow.deployments import DeploymentToolSettings, DeployTargetSettings
from onceflow.email import EmailSettings, EmailToolSettings
from onceflow.encryption import PayloadEncryptionSettings
from onceflow.gateway import GatewaySettings, RetentionTooShort, check_retention
from onceflow.payments import PaymentToolSettings, StripeSettings
from onceflow.settings import (
    FileBackedSettings,
    InvalidSettings,
    OnceflowSettings,
    SettingsReader,
    declared_settings_classes,
)


class OnceflowConfiguration(BaseModel):
    """Every settings section of onceflow, each typed; ``load_configuration`` builds it."""

    model_config = ConfigDict(frozen=True)

    onceflow: OnceflowSettings
    """``[onceflow]`` and ``ONCEFLOW_*``, ``DATABASE_URL``: shared by every process."""
    stripe: StripeSettings
    """``[stripe]`` and ``STRIPE_*``, ``ONCEFLOW_STRIPE_*``: how workers reach Stripe."""
    email: EmailSettings
    """``[email]`` and ``SMTP_URL``, ``ONCEFLOW_EMAIL_*``: the outbox and its relays."""
    deploy_target: DeployTargetSettings
    """``[deploy_target]`` and ``DEPLOY_TARGET_URL``, ``ONCEFLOW_DEPLOY_TARGET_*``."""
    gateway: GatewaySettings
    """``[gateway]`` and ``ONCEFLOW_GATEWAY_*``: the boundary's records and quotas."""
    payment_tool: PaymentToolSettings
    """``[tools.payments]`` and ``ONCEFLOW_PAYMENTS_*``: same on every worker."""
    email_tool: EmailToolSettings
    """``[tools.email]`` and ``ONCEFLOW_EMAIL_*``: same on every worker."""
    deployment_tool: DeploymentToolSettings
    """``[tools.deployments]`` and ``ONCEFLOW_DEPLOYMENTS_*``: same on every worker."""
    payload_encryption: PayloadEncryptionSettings
    """``[payload_encryption]`` and ``ONCEFLOW_PAYLOAD_KEYS``, ``ONCEFLOW_UI_ORIGIN``: the
    same keys in every process that talks to Temporal."""
    config_file: Path | None = None
    """The file the sections were read from (``ONCEFLOW_CONFIG``). Default: none."""

    def sections(self) -> Iterator[tuple[str, FileBackedSettings]]:
        """Each section with the name of its table in the file, in declaration order."""
        for name in type(self).model_fields:
            section = getattr(self, name)
            if isinstance(section, FileBackedSettings):
                yield section.config_table, section


def load_configuration() -> OnceflowConfiguration:
    """Read and check every section; raises ``InvalidSettings`` listing every problem."""
    reader = SettingsReader()
    sections: dict[str, FileBackedSettings | None] = {}
    for name, field in OnceflowConfiguration.model_fields.items():
        section_class = field.annotation
        if isinstance(section_class, type) and issubclass(section_class, FileBackedSettings):
            sections[name] = reader.read(section_class)
    onceflow = sections["onceflow"]
    if isinstance(onceflow, OnceflowSettings) and onceflow.tools:
        problems, packages = _custom_tool_problems(onceflow.tools)
        reader.problems.extend(problems)
        # The tools' own settings (read when the worker opens their clients) are checked
        # now too, so a bad value stops every process at start, not the first attempt.
        for settings_class in declared_settings_classes():
            if any(_within(settings_class.__module__, package) for package in packages):
                reader.read(settings_class)
    reader.check_file()  # after loading custom tools: only then are their tables known
    gateway = sections["gateway"]
    if isinstance(gateway, GatewaySettings):
        try:
            check_retention(gateway)
        except RetentionTooShort as too_short:
            reader.problems.append(f"{too_short}; fix: raise it above the window")
    reader.raise_problems()
    return OnceflowConfiguration.model_validate(
        {**sections, "config_file": reader.config.path if reader.config else None}
    )


def _custom_tool_problems(specs: tuple[str, ...]) -> tuple[list[str], set[str]]:
    """Import the custom tools (not registering them), so their settings classes and tables
    are known; a tool that cannot be loaded is a problem of ``[onceflow] tools``. Also
    returns the packages the tools come from."""
    from onceflow.tools import ToolRegistrationError, load_tools

    try:
        tools = load_tools(specs)
    except InvalidSettings as invalid:
        return list(invalid.problems), set()
    except ToolRegistrationError as refused:
        return [" ".join(str(refused).split())], set()
    modules = {tool.perform.__module__ for tool in tools}
    return [], {module.rpartition(".")[0] or module for module in modules}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")
