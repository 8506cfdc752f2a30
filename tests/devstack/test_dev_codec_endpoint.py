"""``onceflow dev`` with payload keys points its Web UI at its gateway's codec endpoint.

The dev server is told the endpoint when it starts (``--ui-codec-endpoint``), so the
gateway's port is settled first; the endpoint is named on ``localhost`` like the UI, and
the one origin it answers is that UI's unless ``ONCEFLOW_UI_ORIGIN`` says otherwise. The
browser test (``tests/encryption/test_codec_ui.py``) runs the dev server so started.
"""

import base64

from onceflow_devstack.ports import StackPorts
from onceflow_devstack.stack import _codec_endpoint, _encryption_exports
from pydantic import SecretStr

from onceflow.encryption import PayloadEncryptionSettings
from tests.tool_configuration import configuration

KEYS = f"k1:{base64.b64encode(bytes(32)).decode()}"


def test_with_keys_the_ui_is_started_with_the_gateways_codec_endpoint() -> None:
    keys = PayloadEncryptionSettings(payload_keys=(SecretStr(KEYS),))
    ports = StackPorts(temporal=17233, ui=18233, gateway=18080)

    encryption, endpoint, gateway_port = _codec_endpoint(
        configuration(payload_encryption=keys), ports
    )

    assert endpoint == "http://localhost:18080/codec" and gateway_port == 18080
    assert encryption.ui_origin == "http://localhost:18233"
    assert encryption.key_ring() == keys.key_ring()
    # Commands joining the stack (`source .onceflow/dev.env`) read its tasks with its keys.
    assert _encryption_exports(encryption)["ONCEFLOW_PAYLOAD_KEYS"] == KEYS


def test_an_explicit_ui_origin_is_kept_and_without_keys_there_is_no_endpoint() -> None:
    ports = StackPorts(ui=18233)
    chosen = PayloadEncryptionSettings(
        payload_keys=(SecretStr(KEYS),), ui_origin="https://temporal.example.com"
    )

    encryption, endpoint, gateway_port = _codec_endpoint(
        configuration(payload_encryption=chosen), ports
    )
    assert encryption.ui_origin == "https://temporal.example.com"
    assert endpoint is not None and gateway_port is not None
    assert endpoint == f"http://localhost:{gateway_port}/codec"

    plain, none, unchanged = _codec_endpoint(configuration(), ports)
    assert none is None and unchanged is None and not plain.enabled
    assert _encryption_exports(plain) == {}
