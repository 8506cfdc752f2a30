"""Connects to Temporal with the standard settings and ``OnceflowPlugin``."""

from temporalio.client import Client
from temporalio.envconfig import ClientConfig

from onceflow.encryption import PayloadEncryptionSettings
from onceflow.plugin import OnceflowPlugin

DEFAULT_ADDRESS = "localhost:7233"


async def connect_temporal(
    *, address: str | None = None, encryption: PayloadEncryptionSettings | None = None
) -> Client:
    """A client configured by ``temporalio.envconfig`` (``TEMPORAL_ADDRESS``, ``_NAMESPACE``,
    ``_API_KEY``, TLS, profile file); ``address`` overrides the configured address.

    Defaults to the embedded dev server at ``localhost:7233``. The client carries
    ``OnceflowPlugin(encryption=encryption)``: Temporal's tracing interceptor, which every
    worker built on it inherits (a worker adds a client's interceptors to its own), so
    spans go wherever the process's tracer provider sends them, nowhere when
    ``process_telemetry`` configured none; and the data converter
    ``onceflow_data_converter(encryption)``, which a worker built on the client uses too:
    payloads are encrypted when ``encryption`` holds keys.
    """
    config = ClientConfig.load_client_connect_config()
    if address is not None:
        config["target_host"] = address
    config.setdefault("target_host", DEFAULT_ADDRESS)
    return await Client.connect(
        **config,
        plugins=[OnceflowPlugin(encryption=encryption)],
    )
