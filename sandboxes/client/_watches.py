"""A streamed file watch of a remote sandbox as the client reads it (``GET .../watch``): its
events as they come, as a sync (`WatchStream`) or async (`AsyncWatchStream`) iterator. Opened
once its ``start`` line came (the watch is in place); ``keepalive`` lines and types this client
does not know are skipped; an ``end`` line, or the connection's loss, ends the iteration with
``error`` and ``message`` saying why.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pydantic

from sandboxes import api
from sandboxes import protocol as p
from sandboxes.client import _ops
from sandboxes.client._http import AsyncServiceConnection, ServiceConnection
from sandboxes.client._light import TransportErrors
from sandboxes.client._pump import apump, pump
from sandboxes.client.errors import ConnectionLost

__all__ = ["AsyncWatchStream", "WatchStream"]

_SKIPPED = frozenset({"start", "keepalive"})
_LINE_ERRORS = (httpx.TransportError, httpx.StreamClosed)
"""What reading a watch's next line may raise: its connection's loss, or its close."""


class _Watch:
    """A watch stream's state, free of I/O and shared by both flavours (a `Reader` of its
    lines): fed the stream's lines (``None`` at its end), it gives the events to hand out. Once
    ``ended`` it gives none, and ``error`` and ``message`` say why (``None``: its client closed it)."""

    error: p.ErrorCode | None = None
    message: str | None = None
    ended: bool = False
    _what: str

    def _start(self, first: str) -> None:
        """Raises `ConnectionLost` unless ``first``, the stream's first line, is its ``start``."""
        try:
            started = api.WatchEvent.model_validate_json(first).type == "start"
        except pydantic.ValidationError:
            started = False
        if not started:
            raise ConnectionLost(f"{self._what}: the watch did not start ({first[:200]!r})")

    def take(self, line: str | None) -> api.WatchEvent | None:
        """The event a line carries, ``None`` for one to skip; an ``end`` line, or the stream's
        end (``None``), ends the watch."""
        if line is None:
            if not self.ended:
                self.lost(f"{self._what}: the stream ended before the watch did")
            return None
        if not line.strip():
            return None
        try:
            event = api.WatchEvent.model_validate_json(line)
        except pydantic.ValidationError:
            return None  # a newer service's type, or not ours: skipped
        if event.type in _SKIPPED:
            return None
        if event.type == "end":
            self.ended, self.error, self.message = True, event.error, event.message
            return None
        return event

    feed = take

    @property
    def done(self) -> bool:
        """`Reader.done`: the watch ended (or was closed); nothing more is read."""
        return self.ended

    def lost(self, message: str) -> None:
        self.ended, self.error, self.message = True, p.CONNECTION_LOST, message

    def broke(self, exc: Exception) -> None:
        """Reading the next line raised ``exc`` (one of `_LINE_ERRORS`): the watch is lost."""
        self.lost(f"{self._what}: {exc}")


class WatchStream(Iterator[api.WatchEvent], _Watch):
    """A remote sandbox's directory watched (`RemoteSandbox.watch`): its events until `close`
    or the watch's end."""

    def __init__(
        self, connection: ServiceConnection, sandbox_id: str, path: str, recursive: bool, timeout: float | None = None
    ) -> None:
        op = _ops.watch(sandbox_id, path, recursive, timeout)
        self._what = op.what
        self._response = connection.open(op)
        self._lines = self._response.iter_lines()
        try:
            with TransportErrors(op.what):
                first = next(self._lines, "")
            self._start(first)
        except BaseException:
            self._response.close()
            raise
        self._events = pump(self, lambda: next(self._lines, None), _LINE_ERRORS)

    def __next__(self) -> api.WatchEvent:
        event = next(self._events, None)
        if event is None:
            self._response.close()
            raise StopIteration
        return event

    def close(self) -> None:
        """Stop the watch (the service ends it once its stream is gone)."""
        self.ended = True
        self._response.close()

    def __enter__(self) -> WatchStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncWatchStream(AsyncIterator[api.WatchEvent], _Watch):
    """`WatchStream`'s async twin, made by `open`."""

    def __init__(self, response: httpx.Response, lines: AsyncIterator[str], what: str) -> None:
        self._response = response
        self._lines = lines
        self._what = what
        self._events = apump(self, lambda: anext(self._lines, None), _LINE_ERRORS)

    @classmethod
    async def open(
        cls,
        connection: AsyncServiceConnection,
        sandbox_id: str,
        path: str,
        recursive: bool,
        timeout: float | None = None,  # noqa: ASYNC109 - the watch's lifetime in the service, not a wait here
    ) -> AsyncWatchStream:
        op = _ops.watch(sandbox_id, path, recursive, timeout)
        response = await connection.open(op)
        stream = cls(response, response.aiter_lines(), op.what)
        try:
            with TransportErrors(op.what):
                first = await anext(stream._lines, "")
            stream._start(first)
        except BaseException:
            await response.aclose()
            raise
        return stream

    async def __anext__(self) -> api.WatchEvent:
        event = await anext(self._events, None)
        if event is None:
            await self._response.aclose()
            raise StopAsyncIteration
        return event

    async def aclose(self) -> None:
        """`WatchStream.close`'s async twin."""
        self.ended = True
        await self._response.aclose()

    async def __aenter__(self) -> AsyncWatchStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
