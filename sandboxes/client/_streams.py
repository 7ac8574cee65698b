"""A streamed execute as the client reads it: output chunks, then one final response, following
the command again once (from the last byte offset it saw) if the connection drops mid-stream.

The service runs a streamed command detached from its connection and keeps its output, so a
stream that broke loses nothing: the re-attached one (``GET .../execute/{id}/stream?offset=N``)
carries exactly the bytes after the last ``output`` event seen. Empty ``output`` events (the
first, keep-alives) and types this client does not know are skipped. Each chunk is an
`OutputChunk`: its text, and the stream it came from.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from typing import Literal

import httpx

from sandboxes import api
from sandboxes import protocol as p
from sandboxes.client import _ops
from sandboxes.client import _wire as w
from sandboxes.client._http import AsyncServiceConnection, ServiceConnection
from sandboxes.client._pump import apump, pump
from sandboxes.client.errors import ConnectionLost, SandboxServiceError, error_from_transport

__all__ = ["AsyncCommandStream", "CommandStream", "OutputChunk"]


class OutputChunk(str):
    """A chunk of a streamed command's output: its text (a `str`, so the chunks joined are the
    merged output), and ``stream``, where it came from: ``stdout``, ``stderr``, or ``merged``
    where the backend ran the command without the exec helper and could not tell them apart."""

    stream: Literal["stdout", "stderr", "merged"]

    def __new__(cls, text: str, stream: Literal["stdout", "stderr", "merged"] = "stdout") -> OutputChunk:
        chunk = super().__new__(cls, text)
        chunk.stream = stream
        return chunk


Item = OutputChunk | p.ExecuteResponse


class _Position:
    """Where a stream is: its command's id (from its first event) and the byte offset its output
    events reached, the point to re-attach from."""

    def __init__(self, sandbox_id: str, reattach: bool) -> None:
        self.sandbox_id = sandbox_id
        self.command_id: str | None = None
        self.offset = 0
        self.reattach = reattach
        self.lost: str | None = None
        """Why the current connection ended before the exit event (``None``: it did not)."""

    def take(self, event: api.StreamEvent) -> Item | None:
        """What ``event`` gives the caller, if anything, once the position has followed it."""
        if event.type == "exit":
            return w.exit_response(event)
        if event.id is not None:
            self.command_id = event.id
        if event.offset is not None:
            self.offset = event.offset
        if not event.data:  # the first event, or a keep-alive
            return None
        return OutputChunk(event.data, event.stream or "stdout")

    def again(self) -> w.Op[None] | None:
        """The request that follows the command from where it was, once; ``None``: give up."""
        if not self.reattach or self.command_id is None:
            return None
        self.reattach = False
        return _ops.attach_stream(self.sandbox_id, self.command_id, self.offset)

    def then(self) -> w.Op[None] | None:
        """After a connection ended: the request to follow next (the one re-attach, once the
        stream was lost), ``None`` when the stream is over."""
        return None if self.lost is None else self.again()

    def ending(self) -> p.ExecuteResponse | None:
        """What ends a stream once `then` said it is over: a ``connection_lost`` response if it
        was given up as lost, ``None`` if its exit event came."""
        return None if self.lost is None else w.lost_execution(self.lost)

    def kill(self) -> w.Op[p.ExecuteResponse] | None:
        """The request that kills the command, ``None`` while its id is unknown (not started)."""
        return None if self.command_id is None else _ops.kill_stream(self.sandbox_id, self.command_id)

    def follow(self, op: w.Op[None]) -> _Reading:
        """``op`` is sent: the reader of its answer's lines. Until its exit event arrives, the
        stream counts as lost."""
        self.lost = f"{op.what}: the stream ended before the command's exit"
        return _Reading(self, op)


class _Reading:
    """One connection's lines of a followed stream, free of I/O (a `Reader`): each line moves
    the position and gives what the caller sees; done at the command's exit or the connection's
    end. A malformed line ends it as the connection's failure does: the stream is lost from
    there and may be followed again."""

    __slots__ = ("_op", "_position", "done")

    def __init__(self, position: _Position, op: w.Op[None]) -> None:
        self._position, self._op = position, op
        self.done = False

    def feed(self, line: str | None) -> Item | None:
        """What a line gives the caller, if anything (``None``: the connection's end)."""
        if line is None:
            self.done = True
            return None
        try:
            item = _item(self._position, line)
        except ConnectionLost as exc:
            self.broke(exc)
            return None
        if isinstance(item, p.ExecuteResponse):
            self._position.lost = None
            self.done = True
        return item

    def broke(self, exc: Exception) -> None:
        """The connection failed mid-stream (httpx's error), or a line was malformed."""
        self.done = True
        if isinstance(exc, httpx.TransportError):
            exc = error_from_transport(exc, self._op.what)
        self._position.lost = exc.message if isinstance(exc, SandboxServiceError) else str(exc)

    def refused(self, exc: SandboxServiceError) -> None:
        """The request was not answered with a stream: a refused start raises as any other
        call does; a lost one, or a re-attach the service cannot serve, ends this stream."""
        if self._op.method == "POST" and not isinstance(exc, ConnectionLost):
            raise exc
        self._position.lost = exc.message


_BROKEN = (httpx.TransportError,)
"""What reading a stream's next line may raise: its connection's failure."""


class _Followed:
    """Where a stream is, as both flavours say it: the command's id and the offset reached."""

    _position: _Position

    @property
    def command_id(self) -> str | None:
        return self._position.command_id

    @property
    def offset(self) -> int:
        return self._position.offset


class CommandStream(_Followed, Iterator[Item]):
    """Output chunks (`OutputChunk`, a str) as the command prints them, then exactly one `ExecuteResponse` (a
    ``connection_lost`` one if the stream broke and following it again failed). ``command_id``
    and ``offset`` say where it is, to re-attach later (`RemoteSandbox.attach_stream`)."""

    def __init__(
        self, connection: ServiceConnection, sandbox_id: str, op: w.Op[None], *, reattach: bool = True
    ) -> None:
        self._connection = connection
        self._position = _Position(sandbox_id, reattach)
        self._items = self._run(op)

    def __next__(self) -> Item:
        return next(self._items)

    def close(self) -> None:
        """Stop reading (the command runs on in the service)."""
        self._items.close()

    def kill(self) -> p.ExecuteResponse | None:
        """Stop reading and kill the command's whole process tree; its final response, or
        ``None`` if it never started (nothing was read from this stream yet)."""
        self._items.close()
        op = self._position.kill()
        return None if op is None else self._connection.call(op)

    def _run(self, op: w.Op[None]) -> Generator[Item]:
        following: w.Op[None] | None = op
        while following is not None:
            yield from self._follow(following)
            following = self._position.then()
        if (ending := self._position.ending()) is not None:
            yield ending

    def _follow(self, op: w.Op[None]) -> Generator[Item]:
        reading = self._position.follow(op)
        try:
            response = self._connection.open(op)
        except SandboxServiceError as exc:
            reading.refused(exc)
            return
        lines = response.iter_lines()
        items: Generator[Item] = pump(reading, lambda: next(lines, None), _BROKEN)
        with contextlib.closing(response):
            yield from items


class AsyncCommandStream(_Followed, AsyncIterator[Item]):
    """`CommandStream`'s async twin."""

    def __init__(
        self,
        connect: Callable[[], AsyncServiceConnection],
        sandbox_id: str,
        op: w.Op[None],
        *,
        reattach: bool = True,
    ) -> None:
        self._connect = connect
        """The connection, made on first use: inside the event loop that iterates."""
        self._position = _Position(sandbox_id, reattach)
        self._items = self._run(op)

    async def __anext__(self) -> Item:
        return await anext(self._items)

    async def aclose(self) -> None:
        """Stop reading (the command runs on in the service)."""
        await self._items.aclose()

    async def akill(self) -> p.ExecuteResponse | None:
        """`CommandStream.kill`'s async twin."""
        await self._items.aclose()
        op = self._position.kill()
        if op is None:
            return None
        return await self._connect().call(op)

    async def _run(self, op: w.Op[None]) -> AsyncGenerator[Item]:
        following: w.Op[None] | None = op
        while following is not None:
            async for item in self._follow(following):
                yield item
            following = self._position.then()
        if (ending := self._position.ending()) is not None:
            yield ending

    async def _follow(self, op: w.Op[None]) -> AsyncGenerator[Item]:
        reading = self._position.follow(op)
        try:
            response = await self._connect().open(op)
        except SandboxServiceError as exc:
            reading.refused(exc)
            return
        lines = response.aiter_lines()
        items: AsyncGenerator[Item] = apump(reading, lambda: anext(lines, None), _BROKEN)
        async with contextlib.aclosing(response), contextlib.aclosing(items):
            async for item in items:
                yield item


def _item(position: _Position, line: str) -> Item | None:
    if not line.strip():
        return None
    event = w.stream_event(line)
    return None if event is None else position.take(event)
