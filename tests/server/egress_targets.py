"""The servers the egress tests reach from a sandbox: each an HTTP server on a loopback address
that answers ``hello from`` its address and keeps every request's headers, so that a test sees
both what a sandbox was answered and whether a refused target was ever connected to."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

__all__ = ["Target", "targets_fixture"]


class Target:
    """An HTTP server on a loopback address that answers its name and keeps each request's headers."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.seen: list[dict[str, str]] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                seen.append({key.lower(): value for key, value in self.headers.items()})
                body = f"hello from {host}".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.server.server_address[1]}/"


def targets_fixture() -> Callable[[], Iterator[tuple[Target, Target]]]:
    """A module-scoped ``targets`` fixture: a `Target` on 127.0.0.2 and one on 127.0.0.3, both
    shut down once the module's tests are done."""

    @pytest.fixture(scope="module")
    def targets() -> Iterator[tuple[Target, Target]]:
        made = (Target("127.0.0.2"), Target("127.0.0.3"))
        yield made
        for target in made:
            target.server.shutdown()
            target.server.server_close()

    return targets
