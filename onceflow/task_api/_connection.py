"""Connects to Temporal with the standard settings, onceflow's data converter and tracing."""

from temporalio.client import Client
from temporalio.envconfig import ClientConfig

from onceflow.encryption import PayloadEncryptionSettings, onceflow_data_converter
from onceflow.telemetry import tracing_interceptor

DEFAULT_ADDRESS = "localhost:7233"


async def connect_temporal(
    *, address: str | None = None, encryption: PayloadEncryptionSettings | None = None
) -> Client:
    """A client configured by ``temporalio.envconfig`` (``TEMPORAL_ADDRESS``, ``_NAMESPACE``,
    ``_API_KEY``, TLS, profile file); ``address`` overrides the configured address.

    Defaults to the embedded dev server at ``localhost:7233``. The client carries
    Temporal's tracing interceptor, and so does every worker built on it (a worker adds
    a client's interceptors to its own): spans go wherever the process's tracer provider
    sends them, nowhere when ``process_telemetry`` configured none. Its data converter is
    ``onceflow_data_converter(encryption)``, and a worker built on the client uses it too:
    payloads are encrypted when ``encryption`` holds keys.
    """
    config = ClientConfig.load_client_connect_config()
    if address is not None:
        config["target_host"] = address
    config.setdefault("target_host", DEFAULT_ADDRESS)
    return await Client.connect(
        **config,
        data_converter=onceflow_data_converter(encryption),
        interceptors=[tracing_interceptor()],
    )
