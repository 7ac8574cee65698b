"""The lean load generator of `bench_service`'s throughput row: one keep-alive HTTP/1.1
connection per client thread, sending one request prepared once, its answer parsed by
``httptools`` (the C parser the service itself runs on).

Why not ``httpx`` (which the reference row still uses): the load generator runs on the machine it
measures, and there 20 ``httpx.Client`` threads cost 0.54 ms of CPU per request, half a core at
the service's rate: CPU taken from the service, and not from the direct side, whose callers are
the backend's own client code. A deployed service's clients run elsewhere. This one cost 0.046
ms per request in the same run (2 cores, Docker backend), so the row measures the service
rather than its load generator.
"""

from __future__ import annotations

import json
import socket
from typing import Any
from urllib.parse import urlsplit

import httptools

__all__ = ["KeepAliveClient"]

_RECV = 1 << 16


class _Answer:
    """``httptools`` callbacks collecting one response."""

    def __init__(self) -> None:
        self.body = bytearray()
        self.complete = False
        self.keep_alive = False
        self.parser = httptools.HttpResponseParser(self)

    def on_headers_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()  # only known until the message ends

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


class KeepAliveClient:
    """One connection to ``url`` sending one JSON ``POST`` again and again (`call`). Never
    reconnects: a request written on a connection the server closed may have been acted on,
    so a closed connection is an error, never a resend; open one per window instead."""

    def __init__(self, url: str, path: str, payload: object, key: str, timeout: float = 60.0) -> None:
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        body = json.dumps(payload).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self._request = head.encode() + body
        self._path = path
        self._socket = socket.create_connection((host, port), timeout=timeout)
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def call(self) -> Any:
        """The parsed JSON answer of one request; `RuntimeError` for a status other than 2xx."""
        answer = _Answer()
        self._socket.sendall(self._request)
        while not answer.complete:
            data = self._socket.recv(_RECV)
            if not data:
                raise ConnectionError(f"POST {self._path}: the server closed the connection")
            answer.parser.feed_data(data)
        status = answer.parser.get_status_code()
        if not 200 <= status < 300:
            raise RuntimeError(f"POST {self._path}: {status} {bytes(answer.body)[:300]!r}")
        if not answer.keep_alive:  # the next request would meet a closed connection
            raise ConnectionError(f"POST {self._path}: the server will close the connection")
        return json.loads(answer.body)

    def close(self) -> None:
        self._socket.close()
