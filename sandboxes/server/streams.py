"""Bridges between blocking producers/consumers of bytes (tarfile, docker-py, a sandbox's output
hook) and the event loop, with bounded memory.

Archives are never held whole: a producer thread hands chunks through a small bounded queue
and blocks while the HTTP client is slower than the disk; an upload is read from the request
body on demand by the thread that parses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

Emit = Callable[[bytes], None]

CHUNK = 256 << 10
_DONE = object()


class ProducerCancelled(Exception):
    """The consumer went away (client disconnected); the producer should stop."""


class ChunkSink(io.RawIOBase):
    """A write-only file that forwards what is written in chunks of about `CHUNK` bytes
    (tarfile writes in 10 KiB records, too small to send one by one)."""

    def __init__(self, emit: Emit, size: int = CHUNK) -> None:
        self._emit = emit
        self._size = size
        self._buffer = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._buffer += data
        if len(self._buffer) >= self._size:
            self._emit(bytes(self._buffer))
            self._buffer.clear()
        return len(data)

    def flush_all(self) -> None:
        if self._buffer:
            self._emit(bytes(self._buffer))
            self._buffer.clear()


async def iterate_thread(produce: Callable[[Emit], None], *, depth: int = 8) -> AsyncIterator[bytes]:
    """Run ``produce(emit)`` in a thread and yield what it emits, in order. ``emit`` blocks while
    ``depth`` chunks wait unread; if the consumer stops early, ``emit`` raises
    `ProducerCancelled` so the producer unwinds. A producer's exception re-raises here."""
    loop = asyncio.get_running_loop()
    items: asyncio.Queue[object] = asyncio.Queue()
    room = threading.Semaphore(depth)
    cancelled = threading.Event()

    def emit(chunk: bytes) -> None:
        while not room.acquire(timeout=0.25):
            if cancelled.is_set():
                raise ProducerCancelled
        if cancelled.is_set():
            raise ProducerCancelled
        loop.call_soon_threadsafe(items.put_nowait, chunk)

    def run() -> None:
        try:
            produce(emit)
            outcome: object = _DONE
        except BaseException as exc:
            outcome = exc
        if not cancelled.is_set():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(items.put_nowait, outcome)

    threading.Thread(target=run, name="sandboxes-stream", daemon=True).start()
    try:
        while True:
            item = await items.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, bytes)
            room.release()
            yield item
    finally:
        cancelled.set()


class BodyReader(io.RawIOBase):
    """A blocking file over an async byte iterator (a request body), for a worker thread: each
    read that needs data fetches the next chunk on the event loop and waits for it."""

    def __init__(self, chunks: AsyncIterator[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self._chunks = chunks
        self._loop = loop
        self._buffer = b""
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buffer and not self._eof:
            future = asyncio.run_coroutine_threadsafe(self._next(), self._loop)
            chunk = future.result()
            if chunk is None:
                self._eof = True
            else:
                self._buffer = chunk
        size = min(len(target), len(self._buffer))
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size

    async def _next(self) -> bytes | None:
        try:
            return await anext(self._chunks)
        except StopAsyncIteration:
            return None


def buffered_body(chunks: AsyncIterator[bytes], loop: asyncio.AbstractEventLoop) -> io.BufferedReader:
    return io.BufferedReader(BodyReader(chunks, loop), CHUNK)
