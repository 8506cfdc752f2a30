"""``python -m devstack.stripe_provider``: run the local Stripe-compatible provider."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ._server import serve


def main(argv: Sequence[str] | None = None) -> None:
    """Parse command-line flags and serve until interrupted.

    Args:
        argv: Arguments without the program name; None reads ``sys.argv``.
    """
    parser = argparse.ArgumentParser(
        prog="python -m devstack.stripe_provider",
        description="Local Stripe-compatible provider with idempotency and fault injection.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind")
    parser.add_argument("--port", type=int, default=12111, help="port to bind; 0 picks one")
    parser.add_argument(
        "--key-retention-seconds",
        type=float,
        default=86400.0,
        help="how long an idempotency key is honoured (Stripe: about 24 h)",
    )
    parser.add_argument(
        "--search-lag-seconds",
        type=float,
        default=0.0,
        help="delay before a new object appears in search results",
    )
    parser.add_argument(
        "--api-key",
        action="append",
        dest="api_keys",
        help="accepted secret key (repeatable); default: any sk_test_ key",
    )
    args = parser.parse_args(argv)
    serve(
        host=args.host,
        port=args.port,
        key_retention_seconds=args.key_retention_seconds,
        search_lag_seconds=args.search_lag_seconds,
        api_keys=args.api_keys,
    )


if __name__ == "__main__":
    main()
