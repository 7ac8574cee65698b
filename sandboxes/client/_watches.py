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
from sandboxes.client.errors import ConnectionLost, error_from_transport

__all__ = ["AsyncWatchStream", "WatchStream"]

_SKIPPED = frozenset({"start", "keepalive"})


def _started(line: str) -> bool:
    """Whether ``line`` is a stream's ``start``."""
    try:
        return api.WatchEvent.model_validate_json(line).type == "start"
    except pydantic.ValidationError:
        return False


class _Ending:
    """Why a watch stream ended: ``None`` while it runs or when its client closed it."""

    error: p.ErrorCode | None = None
    message: str | None = None
    ended: bool = False

    def take(self, line: str) -> api.WatchEvent | None:
        """The event a line carries, ``None`` for one to skip; an ``end`` line ends the stream."""
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

    def lost(self, message: str) -> None:
        self.ended, self.error, self.message = True, p.CONNECTION_LOST, message


class WatchStream(Iterator[api.WatchEvent], _Ending):
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
            first = next(self._lines, "")
        except httpx.TransportError as exc:
            self._response.close()
            raise error_from_transport(exc, op.what) from exc
        if not _started(first):
            self._response.close()
            raise ConnectionLost(f"{op.what}: the watch did not start ({first[:200]!r})")

    def __next__(self) -> api.WatchEvent:
        while not self.ended:
            try:
                line = next(self._lines, None)
            except (httpx.TransportError, httpx.StreamClosed) as exc:
                line = None
                self.lost(f"{self._what}: {exc}")
            if line is None:
                if not self.ended:
                    self.lost(f"{self._what}: the stream ended before the watch did")
                break
            event = self.take(line)
            if event is not None:
                return event
        self._response.close()
        raise StopIteration

    def close(self) -> None:
        """Stop the watch (the service ends it once its stream is gone)."""
        self.ended = True
        self._response.close()

    def __enter__(self) -> WatchStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncWatchStream(AsyncIterator[api.WatchEvent], _Ending):
    """`WatchStream`'s async twin, made by `open`."""

    def __init__(self, response: httpx.Response, lines: AsyncIterator[str], what: str) -> None:
        self._response = response
        self._lines = lines
        self._what = what

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
        lines = response.aiter_lines()
        try:
            first = await anext(lines, "")
        except httpx.TransportError as exc:
            await response.aclose()
            raise error_from_transport(exc, op.what) from exc
        if not _started(first):
            await response.aclose()
            raise ConnectionLost(f"{op.what}: the watch did not start ({first[:200]!r})")
        return cls(response, lines, op.what)

    async def __anext__(self) -> api.WatchEvent:
        while not self.ended:
            try:
                line = await anext(self._lines, None)
            except (httpx.TransportError, httpx.StreamClosed) as exc:
                line = None
                self.lost(f"{self._what}: {exc}")
            if line is None:
                if not self.ended:
                    self.lost(f"{self._what}: the stream ended before the watch did")
                break
            event = self.take(line)
            if event is not None:
                return event
        await self._response.aclose()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """`WatchStream.close`'s async twin."""
        self.ended = True
        await self._response.aclose()

    async def __aenter__(self) -> AsyncWatchStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
