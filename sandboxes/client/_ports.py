"""A port inside a remote sandbox, over the service's TCP tunnel (``GET /v1/sandboxes/{id}/ports/
{port}/connect``, a WebSocket carrying the connection's bytes as binary messages both ways; an
empty message ends the caller's direction, the service closes the WebSocket at the socket's
end): one connection (`PortConnection`, `AsyncPortConnection`), or a local listener forwarding
every connection it accepts (`PortForward`, as ``kubectl port-forward``; on 127.0.0.1 only).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

from websockets.asyncio.client import ClientConnection as AsyncClientConnection
from websockets.asyncio.client import connect as aconnect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from sandboxes.client._wire import ClientConfig

__all__ = ["AsyncPortConnection", "PortConnection", "PortForward", "PortUnreachable"]

logger = logging.getLogger(__name__)

_READ = 64 << 10
_MAX_MESSAGE = 1 << 20
"""The largest message taken from the service (it sends at most 64 KiB at a time)."""


class PortUnreachable(ConnectionError):
    """The service would not open the tunnel: ``status`` is its HTTP answer (401: the key, 404:
    no such sandbox, 502: nothing listens on the port)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def _url(config: ClientConfig, sandbox_id: str, port: int) -> str:
    base = config.base_url()
    scheme = "wss://" if base.startswith("https://") else "ws://"
    return f"{scheme}{base.split('://', 1)[1]}/v1/sandboxes/{sandbox_id}/ports/{port}/connect"


def _refused(exc: InvalidStatus) -> PortUnreachable:
    body = exc.response.body.decode("utf-8", "replace")[:500] if exc.response.body else ""
    return PortUnreachable(exc.response.status_code, body or "the tunnel was refused")


@contextlib.contextmanager
def _opening() -> Iterator[None]:
    """Around the tunnel's opening: the service's refusal of it raised as `PortUnreachable`
    (its status, at most 500 characters of its body)."""
    try:
        yield
    except InvalidStatus as exc:
        raise _refused(exc) from None


def _tunnel(config: ClientConfig, sandbox_id: str, port: int) -> tuple[str, dict[str, Any]]:
    """Where both flavours open the tunnel, and how: the key in a header, messages bounded to
    `_MAX_MESSAGE`, uncompressed (the bytes are the connection's own)."""
    return _url(config, sandbox_id, port), {
        "additional_headers": config.headers(),
        "open_timeout": config.connect_timeout,
        "max_size": _MAX_MESSAGE,
        "compression": None,
    }


def _received(message: bytes | str) -> bytes:
    """A message of the service as the connection's bytes (a text one as its UTF-8)."""
    return message if isinstance(message, bytes) else message.encode("utf-8")


class PortConnection:
    """One TCP connection to the sandbox's port (blocking): ``sendall``, ``recv`` (``b""`` at its
    end), ``shutdown_write``, ``close``. A send and a recv may run on two threads at once."""

    def __init__(self, config: ClientConfig, sandbox_id: str, port: int) -> None:
        self._held = contextlib.ExitStack()
        url, options = _tunnel(config, sandbox_id, port)
        with _opening():
            self._ws: ClientConnection = self._held.enter_context(connect(url, **options))

    def sendall(self, data: bytes) -> None:
        if data:
            self._ws.send(data)

    def recv(self, _size: int = _READ) -> bytes:
        """The next bytes as they came (one message of the service's, whatever ``_size``)."""
        try:
            message = self._ws.recv()
        except ConnectionClosed:
            return b""
        return _received(message)

    def shutdown_write(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            self._ws.send(b"")

    def close(self) -> None:
        self._held.close()

    def __enter__(self) -> PortConnection:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class AsyncPortConnection:
    """`PortConnection` on an event loop: ``await send``, ``await recv``, ``await close``."""

    def __init__(self, ws: AsyncClientConnection) -> None:
        self._ws = ws

    @classmethod
    async def open(cls, config: ClientConfig, sandbox_id: str, port: int) -> AsyncPortConnection:
        url, options = _tunnel(config, sandbox_id, port)
        with _opening():
            return cls(await aconnect(url, **options))

    async def send(self, data: bytes) -> None:
        if data:
            await self._ws.send(data)

    async def recv(self) -> bytes:
        try:
            message = await self._ws.recv()
        except ConnectionClosed:
            return b""
        return _received(message)

    async def shutdown_write(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self._ws.send(b"")

    async def close(self) -> None:
        await self._ws.close()

    async def __aenter__(self) -> AsyncPortConnection:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


class PortForward:
    """Listens on 127.0.0.1:``local_port`` (0: any free one, see `local_port`) and relays every
    connection it accepts to the sandbox's port through a tunnel of its own, until `close`."""

    def __init__(self, config: ClientConfig, sandbox_id: str, port: int, local_port: int = 0) -> None:
        self._config, self._sandbox_id, self._port = config, sandbox_id, port
        self._listener = socket.create_server(("127.0.0.1", local_port))
        self.local_port: int = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._accepting = threading.Thread(target=self._accept, name="port-forward", daemon=True)
        self._accepting.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether it was closed within ``timeout`` seconds (``None``: until it is)."""
        return self._closed.wait(timeout)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self._listener.close()
        with self._lock:
            conns, self._open = list(self._open), set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._accepting.join(10)

    def __enter__(self) -> PortForward:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._open.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="port-forward-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            tunnel = PortConnection(self._config, self._sandbox_id, self._port)
        except Exception as exc:  # the local client sees its connection closed; the reason is logged
            logger.warning("port forward to %s:%d failed: %s", self._sandbox_id, self._port, exc)
            self._drop(conn)
            return
        up = threading.Thread(target=_pump_up, args=(conn, tunnel), daemon=True)
        up.start()
        try:
            while data := tunnel.recv():
                conn.sendall(data)
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        up.join()
        tunnel.close()
        self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        with self._lock:
            self._open.discard(conn)
        conn.close()


def _pump_up(conn: socket.socket, tunnel: PortConnection) -> None:
    """The local client's bytes into the tunnel, then the end of them."""
    try:
        while data := conn.recv(_READ):
            tunnel.sendall(data)
        tunnel.shutdown_write()
    except (OSError, ConnectionClosed):
        tunnel.close()
