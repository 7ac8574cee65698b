"""A TCP connection to a port inside a sandbox, relayed by its exec helper
(`sandboxes._helper._relay`) over a channel (`open_channel` with ``relay: {port, window}``):
as a blocking socket-like object (`RelayedSocket`, `connect_relay`) or as asyncio stream
halves (`RelayReader`, `RelayWriter`, `open_relay`). The same on every backend holding a helper.

Flow control both ways: the helper sends at most `WINDOW` bytes this side has not granted back
(G frames, as the consumer takes them), and this side sends at most what the helper granted (its
window once connected, then what it wrote to the socket). The helper's bytes are the sandbox's:
more than the window buffered here fails the connection instead of growing the buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import time
from collections import deque
from collections.abc import Callable

from sandboxes._helper.frames import GRANT, STDIN
from sandboxes._mux._channel import Channel, open_channel
from sandboxes._mux._command import Command
from sandboxes._mux._shipped import sources_of
from sandboxes._mux._stream import MuxBroken
from sandboxes._mux.client import MuxClient
from sandboxes._output import Stream

__all__ = ["WINDOW", "RelayReader", "RelayWriter", "RelayedSocket", "connect_relay", "open_relay"]

WINDOW = 1 << 20
"""Bytes the helper may send ahead of what this side's consumer took: the receive buffer's bound."""
_GRANT_AT = WINDOW // 4
"""Taken bytes are granted back once this many add up (a quarter of the window: the helper goes
on reading while the rest of the window is in flight, and a grant costs a frame per quarter,
not per chunk)."""
_CHUNK = 64 << 10
"""What a read of the asyncio half asks for by default."""
_FRAME = (256 << 10) - 9
"""The largest I frame's payload: with its header, 256 KiB, what the helper's stdin pipe holds
(`sandboxes._helper._relay.PIPE_SIZE`), so a frame crosses in one write and one read."""
_COUNT = struct.Struct(">I")


class _Relayed:
    """One relayed connection's state, shared by the reader thread (which hands it the helper's
    frames) and its users (which take and put bytes without blocking; `RelayedSocket` and the
    asyncio halves wait around that). Every change wakes whoever waits."""

    def __init__(self, mux: MuxClient, port: int, accepted: int | None = None) -> None:
        self._cond = threading.Condition()
        self._inbox: deque[bytes] = deque()
        self._buffered = 0
        self._taken = 0  # bytes of the first chunk of the inbox already taken
        self._eof = False
        self._credit = 0
        self._connected = False
        self._ended = False
        self._error: str | None = None
        self._to_grant = 0
        self._wakers: list[Callable[[], None]] = []
        self.port = port
        self.channel: Channel = open_channel(
            mux,
            Command("", timeout=0, output_limit=0),
            spec={
                "relay": {"port": port, "window": WINDOW}
                if accepted is None
                else {"accepted": accepted, "window": WINDOW},
                "sources": sources_of("_relay"),
            },
            on_output=self._arrived,
            on_frame=self._framed,
        )
        self._mux = mux
        self.channel.on_end(self._on_end)

    # ------------------------------------------------------------------ the reader thread's side

    def _changed(self) -> None:
        """Under the lock: wake every waiter (threads, and event loops through their wakers)."""
        self._cond.notify_all()
        wakers, self._wakers = self._wakers, []
        for wake in wakers:
            wake()

    def _arrived(self, chunk: bytes, _stream: Stream = "merged", /) -> None:
        overflow = False
        with self._cond:
            if not chunk:
                self._eof = True
            elif self._buffered + len(chunk) > WINDOW:
                overflow = True
                self._error = f"the sandbox sent more than the window of {WINDOW} bytes on port {self.port}"
            else:
                self._inbox.append(chunk)
                self._buffered += len(chunk)
            self._changed()
        if overflow:
            self.channel.kill()

    def _framed(self, kind: bytes, payload: bytes) -> None:
        if kind != GRANT or len(payload) != _COUNT.size:
            return
        with self._cond:
            self._connected = True  # the first grant says so
            self._credit = min(self._credit + _COUNT.unpack(payload)[0], WINDOW)
            self._changed()

    def _on_end(self) -> None:
        with self._cond:
            self._ended = True
            if self._error is None:
                self._error = self.channel.error
            if self._error is None and not self._connected:
                self._error = f"the relay to port {self.port} ended before it connected"
            self._changed()
        self._mux.forget(self.channel.ident)

    # ------------------------------------------------------------------ the users' side

    def _raise(self) -> None:
        """Under the lock, once the connection failed: its error, as a socket's."""
        message = self._error or "closed"
        if not self._connected:
            raise (ConnectionRefusedError if "refused" in message else ConnectionError)(message)
        raise ConnectionResetError(message)

    def wake_on_change(self, wake: Callable[[], None]) -> None:
        with self._cond:
            self._wakers.append(wake)

    def connected(self) -> bool | None:
        """True once connected; None while not yet; raises if it cannot be."""
        with self._cond:
            if self._connected:
                return True
            if self._error is not None or self._ended:
                self._raise()
            return None

    def take(self, size: int) -> bytes | None:
        """Up to ``size`` buffered bytes (``b""`` at their end), or ``None`` when none is there yet."""
        grant = 0
        with self._cond:
            if not self._inbox:
                if self._eof:
                    return b""
                if self._error is not None or self._ended:
                    self._raise()
                return None
            head, start = self._inbox[0], self._taken
            end = min(len(head), start + size)
            if start == 0 and end == len(head):  # the whole chunk: no copy
                chunk = head
            else:
                with memoryview(head) as view:
                    chunk = bytes(view[start:end])
            if end == len(head):
                self._inbox.popleft()
                self._taken = 0
            else:
                self._taken = end
            self._buffered -= len(chunk)
            self._to_grant += len(chunk)
            if self._to_grant >= _GRANT_AT:
                grant, self._to_grant = self._to_grant, 0
        if grant and not self._ended:
            with contextlib.suppress(MuxBroken):  # then the end reports it
                self.channel.send(GRANT, _COUNT.pack(grant))
        return chunk

    def put(self, data: memoryview) -> int:
        """How many of ``data``'s first bytes were sent (0: no credit now); raises once failed."""
        with self._cond:
            if self._error is not None or self._ended:
                self._raise()
            count = min(len(data), self._credit, _FRAME)
            self._credit -= count
        if count:
            try:  # the caller's bytes, copied once: into the frame
                self.channel.send(STDIN, data[:count])
            except MuxBroken as broken:
                raise ConnectionAbortedError(str(broken)) from broken
        return count

    def shut_write(self) -> None:
        self.channel.close_stdin()

    def close(self) -> None:
        self.channel.kill()

    def wait(self, ready: Callable[[], object], deadline: float | None) -> None:
        """Block until ``ready()`` is true (it may raise), or `TimeoutError` at ``deadline``."""
        with self._cond:
            while True:
                if ready():
                    return
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"relay to port {self.port} timed out")
                self._cond.wait(left)

    def ready_to_read(self) -> bool:
        return bool(self._inbox) or self._eof or self._error is not None or self._ended

    def ready_to_write(self) -> bool:
        return self._credit > 0 or self._error is not None or self._ended

    def ready_to_use(self) -> bool:
        return self._connected or self._error is not None or self._ended

    async def until(self, ready: Callable[[], bool]) -> None:
        """Await ``ready()`` on the running loop (woken by the reader thread; no thread waits)."""
        loop = asyncio.get_running_loop()
        while True:
            woken: asyncio.Future[None] = loop.create_future()

            def settle(future: asyncio.Future[None] = woken) -> None:
                if not future.done():
                    future.set_result(None)

            def wake() -> None:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(settle)

            with self._cond:
                if ready():
                    return
                self._wakers.append(wake)
            await woken


class RelayedSocket:
    """A blocking, socket-like TCP connection to a port inside a sandbox: ``recv``, ``sendall``,
    ``shutdown``, ``close``, ``settimeout``; its errors are `ConnectionError`'s."""

    def __init__(self, relayed: _Relayed, timeout: float | None) -> None:
        self._relayed = relayed
        self._timeout = timeout

    def _deadline(self) -> float | None:
        return None if self._timeout is None else time.monotonic() + self._timeout

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def recv(self, size: int) -> bytes:
        while True:
            chunk = self._relayed.take(size)
            if chunk is not None:
                return chunk
            self._relayed.wait(self._relayed.ready_to_read, self._deadline())

    def sendall(self, data: bytes) -> None:
        view, deadline = memoryview(data), self._deadline()
        while view:
            sent = self._relayed.put(view)
            view = view[sent:]
            if view and not sent:
                self._relayed.wait(self._relayed.ready_to_write, deadline)

    def send(self, data: bytes) -> int:
        self.sendall(data)
        return len(data)

    def shutdown_write(self) -> None:
        """The end of the bytes toward the sandbox's server (its read sees EOF)."""
        self._relayed.shut_write()

    def close(self) -> None:
        self._relayed.close()

    def __enter__(self) -> RelayedSocket:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def connect_relay(mux: MuxClient, port: int, timeout: float | None = 30.0) -> RelayedSocket:
    """A connection to 127.0.0.1:``port`` inside the sandbox of ``mux``'s helper, once connected:
    `ConnectionRefusedError` when nothing listens there, `TimeoutError` past ``timeout``."""
    relayed = _Relayed(mux, port)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        relayed.wait(relayed.ready_to_use, deadline)
        relayed.connected()
    except BaseException:
        relayed.close()
        raise
    return RelayedSocket(relayed, timeout)


class RelayReader:
    """The reading half of a relayed connection on an event loop (as `asyncio.StreamReader`)."""

    def __init__(self, relayed: _Relayed) -> None:
        self._relayed = relayed
        self._eof = False

    async def read(self, size: int = _CHUNK) -> bytes:
        """Up to ``size`` bytes as soon as any came; ``b""`` at their end."""
        while True:
            chunk = self._relayed.take(size)
            if chunk is not None:
                self._eof = not chunk
                return chunk
            await self._relayed.until(self._relayed.ready_to_read)

    async def readexactly(self, size: int) -> bytes:
        parts: list[bytes] = []
        left = size
        while left:
            chunk = await self.read(left)
            if not chunk:
                raise asyncio.IncompleteReadError(b"".join(parts), size)
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)

    def at_eof(self) -> bool:
        return self._eof

    def has_news(self) -> bool:
        """Whether a read would answer at once (bytes, their end, or the connection's failure):
        for an idle pooled connection, that it was closed or broke."""
        return self._relayed.ready_to_read()


class RelayWriter:
    """The writing half of a relayed connection on an event loop (as `asyncio.StreamWriter`):
    `write` queues, `drain` sends what the helper's window takes and waits for the rest."""

    def __init__(self, relayed: _Relayed) -> None:
        self._relayed = relayed
        self._queued: deque[bytes] = deque()
        self._sent = 0  # bytes of the first queued buffer already sent
        self._closing = False

    def write(self, data: bytes) -> None:
        """Queue ``data`` for `drain`: bytes as they are (one copy, into their frames), anything
        else copied now (its owner may change it)."""
        if data:
            self._queued.append(data if type(data) is bytes else bytes(data))

    async def drain(self) -> None:
        """Send what is queued as the helper's window takes it; a drain cancelled midway (a
        timeout) leaves the rest queued, and what was sent is never sent again."""
        while self._queued:
            view = memoryview(self._queued[0])
            while self._sent < len(view):
                sent = self._relayed.put(view[self._sent :])
                self._sent += sent
                if not sent:
                    await self._relayed.until(self._relayed.ready_to_write)
            self._queued.popleft()
            self._sent = 0

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        """The end of the bytes toward the sandbox's server, once the queued ones went
        (call after `drain`)."""
        self._relayed.shut_write()

    def close(self) -> None:
        self._closing = True
        self._relayed.close()

    def is_closing(self) -> bool:
        return self._closing

    async def wait_closed(self) -> None:
        await self._relayed.until(lambda: self._relayed._ended)


async def open_relay(mux: MuxClient, port: int, *, accepted: int | None = None) -> tuple[RelayReader, RelayWriter]:
    """A connection to 127.0.0.1:``port`` inside the sandbox, as asyncio stream halves, once
    connected (`ConnectionRefusedError` when nothing listens there); ``accepted``: instead, the
    connection a listener of the helper accepted under that number (`sandboxes._mux._listen`)."""
    relayed = _Relayed(mux, port, accepted)
    try:
        await relayed.until(relayed.ready_to_use)
        relayed.connected()
    except BaseException:
        relayed.close()
        raise
    return RelayReader(relayed), RelayWriter(relayed)
