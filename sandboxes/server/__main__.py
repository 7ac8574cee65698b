"""``python -m sandboxes.server``: run the service (`serve`), or make API keys for it.

The service refuses to start without API keys unless ``--insecure`` is given, and then says
so loudly: an open sandbox service is remote code execution for anyone who can reach it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from pydantic import ValidationError

from sandboxes.server import logs
from sandboxes.server.auth import generate_key, hash_key
from sandboxes.server.settings import ServiceSettings

logger = logging.getLogger("sandboxes.server")

_INSECURE_BANNER = """
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
!!  INSECURE MODE: no API keys. Anyone who can reach {where}
!!  can run any command in sandboxes on this machine. Use only on a laptop,
!!  bound to 127.0.0.1. Configure api_keys for anything else.
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sandboxes.server",
        description="Run the sandbox service. Settings: --options over SANDBOXES_* variables over the config file.",
    )
    parser.add_argument("--config", type=Path, help="TOML or JSON config file (also SANDBOXES_CONFIG_FILE)")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8080; 0 picks a free one)")
    parser.add_argument("--data-dir", type=Path, help="local sandboxes and restart state")
    parser.add_argument("--owner", help="owner label of this service's containers")
    parser.add_argument("--log-level", help="DEBUG, INFO, WARNING...")
    parser.add_argument("--insecure", action="store_true", help="start without API keys (loudly)")
    parser.add_argument("--hash-key", action="store_true", help="read an API key on stdin, print its SHA-256")
    parser.add_argument("--new-key", metavar="TENANT", help="print a new API key and its api_keys entry")
    return parser


def serve(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.hash_key:
        print(hash_key(sys.stdin.readline().strip()))
        return 0
    if args.new_key:
        key = generate_key()
        print(f"API key (give it to the tenant; it is not stored): {key}")
        print(f'config entry:  [api_keys]\n"{hash_key(key)}" = "{args.new_key}"')
        return 0
    options: dict[str, Any] = {
        "config_file": args.config,
        "host": args.host,
        "port": args.port,
        "data_dir": args.data_dir,
        "owner": args.owner,
        "log_level": args.log_level,
        "insecure": True if args.insecure else None,
    }
    try:
        settings = ServiceSettings(**{key: value for key, value in options.items() if value is not None})
    except (ValidationError, ValueError, OSError) as exc:
        print(f"sandboxes.server: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if not settings.api_keys and not settings.insecure:
        print(
            "sandboxes.server: refusing to start without API keys. Configure api_keys "
            "(`python -m sandboxes.server --new-key TENANT` makes one), or pass --insecure.",
            file=sys.stderr,
        )
        return 2
    logs.configure(settings.log_level)
    if settings.insecure:
        print(_INSECURE_BANNER.format(where=f"{settings.host}:{settings.port}"), file=sys.stderr, flush=True)
        logger.warning("INSECURE MODE: %s", "no API keys" if not settings.api_keys else "unisolated templates allowed")
    from sandboxes.server.app import create_app

    try:
        app = create_app(settings)
    except RuntimeError as exc:
        print(f"sandboxes.server: cannot start: {exc}", file=sys.stderr)
        return 2
    run(app, settings)
    return 0


def run(app: Any, settings: ServiceSettings) -> None:
    """Serve until SIGINT/SIGTERM, then stop accepting, drain in-flight requests (at most
    ``drain_timeout`` seconds), and only then stop the registry."""
    import uvicorn

    from sandboxes.server.serving import collect_less, uvicorn_config

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            app.state.service.draining = True  # /readyz turns 503 while requests drain
            super().handle_exit(sig, frame)

    config = uvicorn_config(
        app,
        host=settings.host,
        port=settings.port,
        drain_timeout=settings.drain_timeout,
        max_header_bytes=settings.max_header_bytes,
    )
    collect_less()  # everything is imported and built: the collector can leave it alone
    _Server(config).run()


if __name__ == "__main__":
    sys.exit(serve())
