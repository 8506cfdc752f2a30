"""The TCP ports of one embedded stack, so several stacks can run side by side on one host.

``onceflow dev --port-base N`` gives a stack seven consecutive ports (``StackPorts.
from_base``); a flag per service overrides one of them. The embedded PostgreSQL needs no
port: it listens only on a Unix socket inside its stack's state folder.
"""

import socket
from dataclasses import dataclass, fields

GATEWAY_PORT = 8080
"""The gateway's port when none is chosen and it is free (else any free one)."""
PROVIDER_PORT = 12111
"""The local Stripe-compatible provider's port when none is chosen and it is free."""
DEPLOY_TARGET_PORT = 12112
"""The local deployment target's port when none is chosen and it is free."""
SMTP_PORT = 2525
"""The local SMTP sink's port when none is chosen and it is free."""
SINK_CONTROL_PORT = 12113
"""Port of the SMTP sink's JSON side door when none is chosen and it is free."""


class PortInUse(RuntimeError):
    """Another program already listens on a port the dev stack needs."""


@dataclass(frozen=True)
class StackPorts:
    """Where each service of one stack listens on 127.0.0.1.

    Temporal's two ports are always taken exactly. For every other service, ``None``
    means its default port, or any free one when that is taken (the banner and
    ``dev.env`` name the one it got); a number means exactly that port, and the stack
    refuses to start while it is taken.
    """

    temporal: int = 7233
    """Temporal's frontend (gRPC). Default 7233."""
    ui: int = 8233
    """Temporal's Web UI. Default 8233."""
    gateway: int | None = None
    """The gateway's HTTP API. Default ``GATEWAY_PORT`` or any free one."""
    provider: int | None = None
    """The local Stripe-compatible provider. Default ``PROVIDER_PORT`` or any free one."""
    smtp: int | None = None
    """The local SMTP sink. Default ``SMTP_PORT`` or any free one."""
    smtp_control: int | None = None
    """The SMTP sink's JSON side door. Default ``SINK_CONTROL_PORT`` or any free one."""
    deploy_target: int | None = None
    """The local deployment target. Default ``DEPLOY_TARGET_PORT`` or any free one."""

    @classmethod
    def from_base(cls, base: int) -> "StackPorts":
        """``base`` and the six ports after it, in field order: Temporal, its UI, the
        gateway, the provider, SMTP, the sink's side door, the deployment target."""
        return cls(*range(base, base + len(fields(cls))))

    def refuse_taken(self) -> None:
        """Stop before anything starts when a chosen port of a service other than Temporal
        is taken (Temporal's may still be held by a server a crashed stack left, which is
        stopped first and checked then).

        Raises:
            PortInUse: Naming every taken port and the flag that chose it.
        """
        taken = [
            f"{port} ({FLAGS[name]})"
            for name, port in self.chosen().items()
            if name not in ("temporal", "ui") and port_is_taken(port)
        ]
        if taken:
            raise PortInUse(
                f"port{'s' if len(taken) > 1 else ''} {', '.join(taken)} already in use by "
                "another program; stop it or choose other ports (--port-base N, or the flag)"
            )

    def chosen(self) -> dict[str, int]:
        """The ports that were chosen, by field name."""
        return {
            field.name: port
            for field in fields(self)
            if isinstance(port := getattr(self, field.name), int)
        }


DEFAULT_PORTS = StackPorts()
"""Every port at its default: Temporal on 7233 and 8233, the rest as free."""

FLAGS = {
    "temporal": "--temporal-port",
    "ui": "--ui-port",
    "gateway": "--gateway-port",
    "provider": "--provider-port",
    "smtp": "--smtp-port",
    "smtp_control": "--smtp-control-port",
    "deploy_target": "--deploy-target-port",
}
"""The ``onceflow dev`` flag of each port."""


def port_is_taken(port: int) -> bool:
    """Whether something on this host already listens on ``127.0.0.1:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False
