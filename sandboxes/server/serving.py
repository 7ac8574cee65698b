"""How uvicorn serves the app: the fastest HTTP stack installed, and every response of known
length written to the socket in one piece.

httptools and uvloop (the ``server`` extra installs both) parse requests and run the event loop
in C; without them uvicorn falls back to h11 and asyncio, which cost the event-loop thread, the
service's bottleneck, several times more per request. The choice is logged at start.

uvicorn writes a response's head (status line and headers) as soon as the app sends it, and the
body in a second write. On loopback or a LAN each write is a packet: the client wakes up for
the head, parses it, sleeps again until the body arrives, and the server makes two system calls
where one would do. `_OnePiece` holds a head that declares a ``Content-Length`` or a chunked
body until the body's first write and sends both together; a head not followed by a body in
the same turn of the event loop (a ``HEAD`` request, a stream whose output is not there yet) is
sent at the end of that turn, so a stream's headers are never held back waiting for its output.

The cyclic garbage collector runs less often (`collect_less`): the event loop's requests allocate
thousands of short-lived containers a second, and each young collection walked the objects of
the requests in flight, none of them garbage.

Request heads are bounded (``max_header_bytes``): h11 by uvicorn's own option; httptools keeps
a header it is given in memory until it ends, however long, so `_bounded_head` counts what
arrives while a head is incomplete and answers 431 and closes the connection past the limit.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import json
import logging
from typing import Any

import uvicorn

logger = logging.getLogger("sandboxes.server")

KEEP_ALIVE = 75
"""Seconds an idle keep-alive connection is kept open (nginx's default; uvicorn's is 5): longer
than the idle timeouts of the proxies and clients in front (60 s is common), so the service is
never the side that closes a connection a client is reusing at that moment, whose request would
be lost unanswered ("server disconnected")."""

_SIZED = b"\r\ncontent-length: "
"""How a head declaring its body's length reads on the wire: uvicorn writes header names in
lower case."""
_CHUNKED = b"\r\ntransfer-encoding: chunked\r\n"
"""How a head of a streamed body reads on the wire."""


_JOIN_LIMIT = 64 << 10
"""Bodies up to this size are copied behind their head; bigger ones follow it in a write of
their own."""


class _OnePiece:
    """A transport that sends a response head of known length with the body that follows it.

    Everything but `write` and `close` is the wrapped transport's own."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._head: bytes | None = None
        self._flush: asyncio.Handle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            self._cancel_flush()
            if len(data) > _JOIN_LIMIT:  # copying a big body costs more than the second write
                self._transport.write(head)
            else:
                data = head + data
        elif (
            isinstance(data, bytes)
            and data.startswith(b"HTTP/")
            and data.endswith(b"\r\n\r\n")
            and (_SIZED in data or _CHUNKED in data)
        ):
            self._head = data
            self._flush = asyncio.get_running_loop().call_soon(self.flush)
            return
        self._transport.write(data)

    def flush(self) -> None:
        """Send a held head now."""
        self._cancel_flush()
        if self._head is not None:
            head, self._head = self._head, None
            if not self._transport.is_closing():
                self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def _cancel_flush(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _one_piece(protocol: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
    class OnePiece(protocol):  # type: ignore[valid-type, misc]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(_OnePiece(transport))  # type: ignore[arg-type]

    OnePiece.__name__ = OnePiece.__qualname__ = f"OnePiece{protocol.__name__}"
    return OnePiece


def _too_large_head(limit: int) -> bytes:
    body = json.dumps({"error": "too_large", "message": f"request head larger than {limit} bytes", "request_id": None})
    return (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n{body}".encode()
    )


def _bounded_head(protocol: type[asyncio.Protocol], limit: int) -> type[asyncio.Protocol]:
    """httptools' protocol refusing a request head over ``limit`` bytes with a 431."""

    class BoundedHead(protocol):  # type: ignore[valid-type, misc]
        _head_bytes = 0
        _in_head = True  # a connection starts with a head
        _began = False

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head = self._began = True
            self._head_bytes = 0

        def on_headers_complete(self) -> None:
            self._in_head = False
            super().on_headers_complete()

        def data_received(self, data: bytes) -> None:
            self._began = False
            super().data_received(data)
            if self._in_head and not self._began and not self.transport.is_closing():
                # A whole read inside one head. The read that began it is not counted (it may
                # also hold the end of a pipelined request), so a head may exceed the limit by
                # at most one read before it is refused.
                self._head_bytes += len(data)
                if self._head_bytes > limit:
                    self.transport.write(_too_large_head(limit))
                    self.transport.close()

    BoundedHead.__name__ = BoundedHead.__qualname__ = f"BoundedHead{protocol.__name__}"
    return BoundedHead


YOUNG_COLLECTION_THRESHOLD = 20_000
"""Net allocations of container objects between two young collections (Python's default: 700)."""


def collect_less() -> None:
    """Make the cyclic garbage collector cheap for a long-running service, once it is set up.

    Every object alive now (modules, the app, its routes and models) is moved out of the
    collector's generations (`gc.freeze`): no full collection walks them again. And the young
    generation is collected after `YOUNG_COLLECTION_THRESHOLD` net allocations instead of 700,
    which the requests in flight reached every few requests: each young collection walked
    their objects, none of them garbage. Cycles are still collected, later: what they hold is
    bounded by the threshold."""
    gc.collect()
    gc.freeze()
    young, older, oldest = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_COLLECTION_THRESHOLD), older, oldest)


def stack() -> tuple[str, str]:
    """(HTTP parser, event loop) the service runs on here."""
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    return http, loop


def uvicorn_config(
    app: Any, *, host: str, port: int, drain_timeout: float, max_header_bytes: int = 16 << 10
) -> uvicorn.Config:
    """The service's uvicorn configuration; the test harness serves with it too."""
    http, loop = stack()
    protocol: type[asyncio.Protocol]
    if http == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        protocol = _bounded_head(HttpToolsProtocol, max_header_bytes)
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        protocol = H11Protocol
    logger.info("serving with %s and the %s event loop", http, loop, extra={"http": http, "loop": loop})
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=_one_piece(protocol),
        loop=loop,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=int(drain_timeout),
        timeout_keep_alive=KEEP_ALIVE,
        h11_max_incomplete_event_size=max_header_bytes,
    )
