"""Settings from the environment and the ONCEFLOW_CONFIG file: precedence, and every
refusal naming the variable, the file key and the fix, without ever echoing a value."""

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from onceflow.configuration import OnceflowConfiguration, load_configuration
from onceflow.gateway import GatewaySettings, InvalidGatewaySettings, load_gateway_settings
from onceflow.payments import PaymentToolSettings, StripeSettings
from onceflow.settings import (
    FileBackedSettings,
    InvalidSettings,
    OnceflowSettings,
    read_settings,
)

WriteConfig = Callable[[str], Path]
SECRET = "tok_live_do-not-print-me-42"


class ExampleToolSettings(FileBackedSettings):
    """A custom tool's settings, as a tool author writes them."""

    config_table = "tools.settings_example"
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_EXAMPLE_", extra="ignore")

    api_token: str = Field(default="tok_defaultsecret", pattern=r"^tok_[a-z]+$")
    """A secret by its name: neither its value nor its default is ever shown."""
    signing_secret: SecretStr | None = None
    """A secret by its type."""
    channel: str
    """Required: no default."""


def refusal(read: Callable[[], object]) -> InvalidSettings:
    with pytest.raises(InvalidSettings) as refused:
        read()
    for problem in refused.value.problems:
        assert "\n" not in problem
    return refused.value


def test_values_come_from_the_file_when_the_environment_is_silent(
    config_file: WriteConfig,
) -> None:
    path = config_file(
        """
        [onceflow]
        task_queue = "from-the-file"
        db_pool_max_size = 20
        database_url = "postgresql://localhost/from-the-file"

        [stripe]
        account = "acct_file"
        api_key = "sk_test_file"

        [tools.payments]
        attempt_timeout = "PT90S"
        """
    )

    configuration = load_configuration()

    assert isinstance(configuration, OnceflowConfiguration)
    assert configuration.config_file == path
    assert configuration.onceflow.task_queue == "from-the-file"
    assert configuration.onceflow.db_pool_max_size == 20
    assert configuration.onceflow.database_url == "postgresql://localhost/from-the-file"
    stripe = next(
        section for section in configuration.tool_sections if section.config_table == "stripe"
    )
    assert configuration.read(StripeSettings) is stripe  # the section load_configuration checked
    assert configuration.read(StripeSettings).account == "acct_file"
    assert configuration.read(StripeSettings).api_key == SecretStr("sk_test_file")
    assert configuration.read(PaymentToolSettings).attempt_timeout == timedelta(seconds=90)
    assert configuration.gateway.db_pool_max_size == 20  # untouched default
    assert read_settings(PaymentToolSettings).attempt_timeout == timedelta(seconds=90)


def test_the_environment_overrides_the_file_and_keyword_arguments_override_both(
    config_file: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file(
        """
        [onceflow]
        db_pool_max_size = 20
        task_queue = "from-the-file"

        [stripe]
        api_key = "sk_test_file"
        account = "acct_file"
        """
    )
    monkeypatch.setenv("ONCEFLOW_DB_POOL_MAX_SIZE", "7")
    monkeypatch.setenv("STRIPE_API_KEY", "sk_test_environment")
    monkeypatch.setenv("ONCEFLOW_STRIPE_ACCOUNT", "acct_environment")

    settings = read_settings(OnceflowSettings)
    stripe = read_settings(StripeSettings)

    assert settings.db_pool_max_size == 7
    assert settings.task_queue == "from-the-file"
    assert stripe.api_key == SecretStr("sk_test_environment")
    assert stripe.account == "acct_environment"
    assert OnceflowSettings(db_pool_max_size=3).db_pool_max_size == 3


def test_the_environment_wins_under_any_of_a_fields_variable_names(
    config_file: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file('[stripe]\napi_key = "sk_test_file"\n')
    monkeypatch.setenv("ONCEFLOW_STRIPE_API_KEY", "sk_test_prefixed")

    assert read_settings(StripeSettings).api_key == SecretStr("sk_test_prefixed")


def test_without_onceflow_config_no_file_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "onceflow.toml").write_text("[onceflow]\ntask_queue = 'nearby'\n")
    monkeypatch.chdir(tmp_path)

    configuration = load_configuration()

    assert configuration.config_file is None
    assert configuration.onceflow.task_queue == "onceflow-tasks"


def test_a_bad_value_in_the_file_names_the_variable_the_file_key_and_the_fix(
    config_file: WriteConfig,
) -> None:
    path = config_file("[onceflow]\ndb_pool_max_size = 500\n")

    refused = refusal(lambda: read_settings(OnceflowSettings))

    assert refused.problems == (
        f"invalid setting ONCEFLOW_DB_POOL_MAX_SIZE ([onceflow] db_pool_max_size in {path}): "
        "Input should be less than or equal to 200; fix: set a value the message allows, or "
        "remove it to use the default 10",
    )


def test_a_bad_value_in_the_environment_names_the_variable_and_the_file_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ONCEFLOW_STRIPE_CONNECT_TIMEOUT", "soon")

    refused = refusal(lambda: read_settings(StripeSettings))

    (problem,) = refused.problems
    assert problem.startswith(
        "invalid setting ONCEFLOW_STRIPE_CONNECT_TIMEOUT (file key [stripe] connect_timeout): "
    )
    assert problem.endswith(
        'fix: set a value the message allows, or unset it to use the default "PT5S"'
    )
    assert "soon" not in problem


def test_a_check_across_fields_names_the_table_and_the_variables(config_file: WriteConfig) -> None:
    config_file('[tools.payments]\nkey_retention = "PT1H"\nretention_margin = "PT2H"\n')

    refused = refusal(lambda: read_settings(PaymentToolSettings))

    assert refused.problems == (
        "invalid settings [tools.payments] (ONCEFLOW_PAYMENTS_*): Value error, "
        "retention_margin must be shorter than key_retention; fix: change the settings it names",
    )


def test_an_unknown_key_is_refused_with_the_nearest_known_name(config_file: WriteConfig) -> None:
    path = config_file("[onceflow]\ndb_pool_max_sise = 5\ncolour = 'blue'\n")

    refused = refusal(lambda: read_settings(OnceflowSettings))

    assert refused.problems[0] == (
        f"unknown setting [onceflow] db_pool_max_sise in {path}; fix: did you mean "
        "db_pool_max_size? rename it, or remove it"
    )
    assert refused.problems[1].startswith(
        f"unknown setting [onceflow] colour in {path}; fix: remove it"
    )
    assert "task_queue" in refused.problems[1]  # the known names are listed


def test_an_unknown_table_is_refused_with_the_nearest_known_table(config_file: WriteConfig) -> None:
    path = config_file("[tools.paymnts]\nattempt_timeout = 'PT1M'\n\n[nonsense]\nx = 1\n")

    refused = refusal(load_configuration)

    assert refused.problems[0] == (
        f"unknown table [tools.paymnts] in {path}; fix: did you mean [tools.payments]? "
        "rename it, or remove it"
    )
    assert refused.problems[1].startswith(f"unknown table [nonsense] in {path}; fix: remove it")


def test_a_setting_outside_any_table_is_refused(config_file: WriteConfig) -> None:
    path = config_file("task_queue = 'q'\n")

    refused = refusal(load_configuration)

    assert refused.problems == (
        f"setting task_queue in {path} is outside any table; fix: move it into [onceflow]",
    )


def test_a_missing_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nowhere.toml"
    monkeypatch.setenv("ONCEFLOW_CONFIG", str(missing))

    refused = refusal(load_configuration)

    assert refused.problems == (
        f"config file {missing} does not exist; fix: point ONCEFLOW_CONFIG (or --config) at a "
        "TOML file, or unset it",
    )
    assert str(refusal(lambda: read_settings(OnceflowSettings))) == str(refused)


def test_broken_toml_is_refused_with_its_line_and_column(config_file: WriteConfig) -> None:
    path = config_file(f'[onceflow]\ntask_queue = "q"\ndatabase_url = {SECRET}\n')

    refused = refusal(load_configuration)

    assert refused.problems == (
        f"config file {path} is not valid TOML: Invalid value (at line 3, column 16); "
        "fix: correct the file there",
    )
    assert SECRET not in str(refused)


def test_every_problem_of_every_section_is_reported_at_once(
    config_file: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file(
        """
        [onceflow]
        db_pool_max_size = 0
        shutdown_grace_secs = 3

        [email]
        batch_size = 5000

        [tools.email]
        attempt_timeout = "PT1S"

        [gatway]
        db_pool_max_size = 5
        """
    )
    monkeypatch.setenv("ONCEFLOW_GATEWAY_CLAIM_LEASE_SECONDS", "-1")

    refused = refusal(load_configuration)

    named = [
        "ONCEFLOW_DB_POOL_MAX_SIZE ([onceflow] db_pool_max_size",
        "ONCEFLOW_EMAIL_BATCH_SIZE ([email] batch_size",
        "ONCEFLOW_EMAIL_ATTEMPT_TIMEOUT ([tools.email] attempt_timeout",
        "ONCEFLOW_GATEWAY_CLAIM_LEASE_SECONDS (file key [gateway] claim_lease_seconds)",
        "[onceflow] shutdown_grace_secs",
        "did you mean shutdown_grace_seconds?",
        "unknown table [gatway]",
    ]
    for part in named:
        assert sum(part in problem for problem in refused.problems) == 1, (part, refused)
    assert len(refused.problems) == 6
    assert str(refused).splitlines() == list(refused.problems)


def test_the_gateway_keeps_its_own_exception_with_the_shared_messages(
    config_file: WriteConfig,
) -> None:
    path = config_file("[gateway]\nreplay_wait_seconds = 301\n")

    with pytest.raises(InvalidGatewaySettings) as refused:
        load_gateway_settings()

    assert isinstance(refused.value, InvalidSettings)
    assert refused.value.problems == (
        f"invalid setting ONCEFLOW_GATEWAY_REPLAY_WAIT_SECONDS ([gateway] replay_wait_seconds in "
        f"{path}): Input should be less than or equal to 300; fix: set a value the message "
        "allows, or remove it to use the default 10.0",
    )
    config_file("[gateway]\nreplay_wait_seconds = 30\n")
    assert GatewaySettings().replay_wait_seconds == 30  # constructing directly reads it too


def test_a_secret_is_never_echoed(
    config_file: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file(
        f"""
        [tools.settings_example]
        api_token = "{SECRET}"
        signing_secret = ["{SECRET}"]
        channel = "ops"

        [stripe]
        api_kye = "{SECRET}"
        """
    )

    from_file = refusal(lambda: read_settings(ExampleToolSettings))
    everything = refusal(load_configuration)
    monkeypatch.setenv("ONCEFLOW_EXAMPLE_API_TOKEN", SECRET)
    from_environment = refusal(lambda: read_settings(ExampleToolSettings))

    assert any("ONCEFLOW_EXAMPLE_API_TOKEN" in problem for problem in from_file.problems)
    assert any("[stripe] api_kye" in problem for problem in everything.problems)
    assert any("ONCEFLOW_EXAMPLE_API_TOKEN (file key" in p for p in from_environment.problems)
    for refused in (from_file, everything, from_environment):
        assert SECRET not in str(refused)
        assert "tok_defaultsecret" not in str(refused)  # nor a secret's default


def test_a_missing_required_setting_says_where_to_set_it(config_file: WriteConfig) -> None:
    config_file("[tools.settings_example]\n")

    refused = refusal(lambda: read_settings(ExampleToolSettings))

    assert refused.problems == (
        "missing setting ONCEFLOW_EXAMPLE_CHANNEL ([tools.settings_example] channel); fix: set "
        "ONCEFLOW_EXAMPLE_CHANNEL or [tools.settings_example] channel",
    )


def test_a_settings_class_must_name_its_table() -> None:
    with pytest.raises(TypeError, match="config_table"):

        class NoTable(FileBackedSettings):
            value: int = 1

    with pytest.raises(TypeError, match="config_table"):

        class BadTable(FileBackedSettings):
            config_table = "Tools/Bad"


@pytest.mark.parametrize(
    ("variable", "expected"),
    [
        ("a,b", ("a", "b")),
        (" a , b ,, my_pkg.tools:TICKETS ,", ("a", "b", "my_pkg.tools:TICKETS")),
        ("", ()),
        (" , ", ()),
    ],
)
def test_onceflow_tools_is_a_comma_separated_list(
    variable: str, expected: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONCEFLOW_TOOLS", variable)

    assert read_settings(OnceflowSettings).tools == expected


def test_the_file_names_tools_as_an_array_and_the_environment_overrides_it(
    config_file: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file('[onceflow]\ntools = ["ticketdesk", "my_pkg.tools:SLACK"]\n')

    assert read_settings(OnceflowSettings).tools == ("ticketdesk", "my_pkg.tools:SLACK")
    assert OnceflowSettings().tools == ("ticketdesk", "my_pkg.tools:SLACK")
    monkeypatch.setenv("ONCEFLOW_TOOLS", "other")
    assert read_settings(OnceflowSettings).tools == ("other",)
