"""A Connect server stream written straight to the ASGI connection (`EventStream`): each chunk
as its producer yields it, the one that carries the end-of-stream envelope together with the
response's end (one write), and no task beside it while it is young. Starlette's
``StreamingResponse`` runs every stream in a task group with a second task listening for the
client to leave, which costs the event loop more than the rest of a short command's call."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from sandboxes.server.e2b.connect import STREAM_MEDIA_TYPE

__all__ = ["WATCH_AFTER", "EventStream"]

WATCH_AFTER = 0.05
"""Seconds a stream runs before the client's leaving is watched for (a task reading the
request's ``receive``); a stream that ended sooner never needed one. A client that leaves is
seen at most this much later, and its stream ends (its producer closed)."""

_HEADER = struct.Struct(">BI")
_END_STREAM = 0x02


def ends_stream(chunk: bytes) -> bool:
    """Whether the last envelope in ``chunk`` (whole envelopes, one after another) is the
    end-of-stream one; linear in the number of envelopes."""
    offset, flags = 0, 0
    while offset + _HEADER.size <= len(chunk):
        flags, length = _HEADER.unpack_from(chunk, offset)
        offset += _HEADER.size + length
    return offset == len(chunk) and bool(flags & _END_STREAM)


class EventStream(StreamingResponse):
    """A ``application/connect+json`` stream of the envelopes ``chunks`` yields (each chunk whole
    envelopes); the chunk that ends the stream ends the response, and the producer is closed
    (its ``finally`` run) whenever the stream stops, the client gone included."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        super().__init__(chunks, media_type=STREAM_MEDIA_TYPE)
        self._chunks = chunks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming = asyncio.current_task()
        left: list[bool] = []
        watching: list[asyncio.Task[None]] = []

        async def watch() -> None:
            message: Message = {"type": ""}
            while message["type"] != "http.disconnect":
                message = await receive()
            if streaming is not None:
                left.append(True)
                streaming.cancel()

        loop = asyncio.get_running_loop()
        timer = loop.call_later(WATCH_AFTER, lambda: watching.append(asyncio.create_task(watch())))
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk in self._chunks:
                last = ends_stream(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": not last})
                if last:
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not left or streaming is None:
                raise
            streaming.uncancel()  # the client left: nothing more to write, the stream just ends
        finally:
            timer.cancel()
            for task in watching:
                task.cancel()
            await _closed(self._chunks, left)


async def _closed(chunks: AsyncIterator[bytes], left: list[bool]) -> None:
    """``chunks`` closed (an async generator's ``finally`` run); a cancellation that only said
    the client left is not passed on."""
    close = getattr(chunks, "aclose", None)
    if close is None:
        return
    try:
        await close()
    except asyncio.CancelledError:
        if not left:
            raise
