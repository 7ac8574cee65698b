"""Terminals in a sandbox of the service (`RemoteSandbox.pty`): the service's WebSocket
(``GET /v1/sandboxes/{id}/pty``, `sandboxes.server.terminals`) as an object: `send`, iterate the
output, `resize`, `kill`, `wait` for the exit; `RemoteTerminal` from threads,
`AsyncRemoteTerminal` on an event loop.

The key goes in the ``Authorization`` header, never in the URL. A refusal raises the same
exceptions as every other call (`sandboxes.client.errors`). What the service sends is bounded
(`MAX_MESSAGE` a message) and its text messages parsed as `api.PtyMessage`.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any

import httpx
import pydantic
from websockets.asyncio.client import ClientConnection as AsyncConnection
from websockets.asyncio.client import connect as aconnect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from sandboxes import api
from sandboxes.client import _wire as w
from sandboxes.client._pump import apump, pump
from sandboxes.client.errors import ConnectionLost, SandboxServiceError, ServiceUnreachable, error_from_response

__all__ = ["MAX_MESSAGE", "AsyncRemoteTerminal", "RemoteTerminal", "aopen_pty", "open_pty"]

MAX_MESSAGE = 1 << 20
"""Bytes of one message from the service at most (it sends output in chunks far below it)."""


def _url(config: w.ClientConfig, sandbox_id: str, size: api.PtySize, command: str | None, session: str | None) -> str:
    query: dict[str, str | int] = {"cols": size.cols, "rows": size.rows}
    if command is not None:
        query["command"] = command
    if session is not None:
        query["session"] = session
    base = config.base_url().replace("http", "ws", 1)
    path = f"{api.API_PREFIX}/sandboxes/{urllib.parse.quote(sandbox_id, safe='')}/pty"
    return f"{base}{path}?{urllib.parse.urlencode(query)}"


def _refused(exc: InvalidStatus) -> SandboxServiceError:
    """The service's refusal of the upgrade, as the error of any other call."""
    answer = exc.response
    return error_from_response(
        httpx.Response(answer.status_code, headers=list(answer.headers.raw_items()), content=bytes(answer.body or b""))
    )


def _parsed(text: str) -> api.PtyMessage | None:
    """A text message of the service: `api.PtyMessage`; None for anything else (an error
    answering a control message the client sent, which `resize` checked already)."""
    try:
        return api.PtyMessage.model_validate_json(text)
    except pydantic.ValidationError:
        return None


@contextlib.contextmanager
def _opening() -> Iterator[None]:
    """Around the WebSocket's opening: its failure raised as the client's error, the service's
    refusal of the upgrade as any other call's, no connection as `ServiceUnreachable`."""
    try:
        yield
    except InvalidStatus as exc:
        raise _refused(exc) from exc
    except OSError as exc:
        raise ServiceUnreachable(f"cannot reach the service: {exc}") from exc


def _connect_options(config: w.ClientConfig) -> dict[str, Any]:
    """How both flavours open the socket: the key in a header, the protocol, what it may carry."""
    return {
        "additional_headers": config.headers(),
        "subprotocols": [api.PTY_SUBPROTOCOL],
        "open_timeout": config.connect_timeout,
        "max_size": MAX_MESSAGE,
    }


def _control(resize: api.PtySize | None = None, kill: bool = False) -> str:
    return api.PtyControl(resize=resize, kill=kill).model_dump_json(exclude_defaults=True)


class _Named:
    """What a terminal's text messages say, for both flavours: its session first, its exit last."""

    def __init__(self) -> None:
        self.exit: api.PtyExit | None = None
        self.session = ""

    def _named(self, chunk: bytes | None) -> None:
        """Raises `ConnectionLost` unless the terminal named its session before any output:
        ``chunk`` is the first output read (``None``: none before the session or the socket's end)."""
        if chunk is not None:
            raise ConnectionLost(f"the service sent {len(chunk)} bytes before the terminal's session")
        if not self.session:
            raise ConnectionLost("the service closed the terminal before naming its session")

    def _ends(self, message: str) -> bool:
        """Whether a text message ends the output being read: it named the session, or the exit."""
        parsed = _parsed(message)
        if parsed is not None and parsed.session is not None and not self.session:
            self.session = parsed.session
            return True
        if parsed is not None and parsed.exit is not None:
            self.exit = parsed.exit
            return True
        return False


class _Read:
    """One read of a terminal's output, free of I/O (a `Reader` of its messages): binary
    messages are the output; it is done once a text message named the session (the first read)
    or the exit, or the socket closed."""

    __slots__ = ("_terminal", "done")

    def __init__(self, terminal: _Named) -> None:
        self._terminal = terminal
        self.done = False

    def feed(self, message: bytes | str | None) -> bytes | None:
        if isinstance(message, bytes):
            return message
        self.done = message is None or self._terminal._ends(message)
        return None

    def broke(self, exc: Exception) -> None:
        self.done = True


_CLOSED = (ConnectionClosed,)


def _typed(data: bytes | str) -> bytes:
    """Bytes typed into the terminal: a str as its UTF-8."""
    return data.encode("utf-8") if isinstance(data, str) else data


class RemoteTerminal(_Named):
    """A terminal in a sandbox of the service, from threads: one may iterate its output while
    others `send`, `resize` or `kill`. ``session`` reattaches (`RemoteSandbox.pty`); `exit` is
    the command's end once the output is read to it."""

    def __init__(self, socket: ClientConnection) -> None:
        super().__init__()
        self._socket = socket
        self._named(next(self._messages(), None))

    def _messages(self) -> Iterator[bytes]:
        """Output until the session is named (the first call) or the exit came."""
        return pump(_Read(self), self._socket.recv, _CLOSED)

    def __iter__(self) -> Iterator[bytes]:
        """The terminal's output as it comes, until the command ended (`exit`) or the socket
        closed (`exit` None: reattach with ``session``)."""
        return self._messages()

    def send(self, data: bytes | str) -> None:
        """Bytes typed into the terminal (a str as UTF-8)."""
        self._socket.send(_typed(data))

    def resize(self, cols: int, rows: int) -> None:
        """The terminal's new size; `pydantic.ValidationError` for one out of bounds."""
        self._socket.send(_control(resize=api.PtySize(cols=cols, rows=rows)))

    def kill(self) -> None:
        """Kill the command and everything it started."""
        self._socket.send(_control(kill=True))

    def wait(self) -> api.PtyExit | None:
        """Read the output to the end (dropping it); the exit, None if the socket closed first."""
        for _ in self._messages():
            pass
        return self.exit

    def close(self) -> None:
        """Leave the terminal (it runs on for the service's grace, to reattach to)."""
        self._socket.close()

    def __enter__(self) -> RemoteTerminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRemoteTerminal(_Named):
    """`RemoteTerminal` on an event loop: ``async for chunk in terminal``."""

    def __init__(self, socket: AsyncConnection) -> None:
        super().__init__()
        self._socket = socket

    async def _start(self) -> None:
        self._named(await anext(self._messages(), None))

    def _messages(self) -> AsyncGenerator[bytes]:
        return apump(_Read(self), self._socket.recv, _CLOSED)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._messages()

    async def send(self, data: bytes | str) -> None:
        await self._socket.send(_typed(data))

    async def resize(self, cols: int, rows: int) -> None:
        await self._socket.send(_control(resize=api.PtySize(cols=cols, rows=rows)))

    async def kill(self) -> None:
        await self._socket.send(_control(kill=True))

    async def wait(self) -> api.PtyExit | None:
        async for _ in self._messages():
            pass
        return self.exit

    async def close(self) -> None:
        await self._socket.close()

    async def __aenter__(self) -> AsyncRemoteTerminal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def open_pty(
    config: w.ClientConfig, sandbox_id: str, size: api.PtySize, command: str | None, session: str | None
) -> RemoteTerminal:
    """Open (or, with ``session``, reattach to) a terminal in ``sandbox_id``."""
    with _opening():
        opened = connect(_url(config, sandbox_id, size, command, session), **_connect_options(config))
        socket = opened.__enter__()  # as a context (websockets 17.1 warns otherwise), left by `close`
    try:
        return RemoteTerminal(socket)
    except BaseException:
        socket.close()
        raise


async def aopen_pty(
    config: w.ClientConfig, sandbox_id: str, size: api.PtySize, command: str | None, session: str | None
) -> AsyncRemoteTerminal:
    """`open_pty` on an event loop."""
    with _opening():
        socket = await aconnect(_url(config, sandbox_id, size, command, session), **_connect_options(config))
    terminal = AsyncRemoteTerminal(socket)
    try:
        await terminal._start()
    except BaseException:
        await socket.close()
        raise
    return terminal
