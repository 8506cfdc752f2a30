"""Connects to Temporal with the standard settings and onceflow's data converter."""

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfig

DEFAULT_ADDRESS = "localhost:7233"


async def connect_temporal(*, address: str | None = None) -> Client:
    """A client configured by ``temporalio.envconfig`` (``TEMPORAL_ADDRESS``, ``_NAMESPACE``,
    ``_API_KEY``, TLS, profile file); ``address`` overrides the configured address.

    Defaults to the embedded dev server at ``localhost:7233``.
    """
    config = ClientConfig.load_client_connect_config()
    if address is not None:
        config["target_host"] = address
    config.setdefault("target_host", DEFAULT_ADDRESS)
    return await Client.connect(**config, data_converter=pydantic_data_converter)
