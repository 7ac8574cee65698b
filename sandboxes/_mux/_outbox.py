"""The requests of awaited commands (`sandboxes._mux._awaited.arun`), written together once the
event loop's turn is over."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Protocol

from sandboxes._mux._stream import ByteStream

__all__ = ["Outbox", "Queued", "Writer"]


class Writer(Protocol):
    """What the `Outbox` writes through (`sandboxes._mux.client.MuxClient`): its stream, the lock
    every frame is written under, and how it breaks."""

    broken: str | None
    _send_lock: threading.Lock
    _stream: ByteStream

    def _break(self, reason: str) -> None: ...


@dataclass(eq=False)
class Queued:
    """A request frame in the `Outbox`. ``unsent``: certainly not written whole (the stream
    broke before its turn, or a write of it alone failed), so the command may be resent."""

    ident: int
    frame: bytes
    unsent: bool = False


class Outbox:
    """Request frames of awaited commands, written together once the event loop's turn is over.

    Requests that reach the service together (20 clients' executes read in one turn of the
    loop) then cost one write to the helper's stream, not one each: the event loop's own cost
    of a system call per request, and on Docker one wake-up each of dockerd, its shim and the
    helper. Sent by the loop that queued them (or first by a thread about to kill one of
    them), under the client's send lock, so a frame is never split by another thread's. The
    resend rule holds (`MuxBroken.may_resend`): a failed write of several frames may have
    written some of them whole, so only a write of one frame alone, or frames never written,
    are marked resendable."""

    def __init__(self) -> None:
        self._queued: list[Queued] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def put(self, client: Writer, loop: asyncio.AbstractEventLoop, ident: int, frame: bytes) -> Queued | None:
        """``frame`` queued for the end of this turn of ``loop``; ``None`` if the stream is broken."""
        item = Queued(ident, frame)
        with client._send_lock:
            if client.broken is not None:
                return None
            if self._loop is not loop:  # frames left by a loop that stopped before its turn ended
                for left in self._queued:  # their commands were abandoned with it; never written
                    left.unsent = True
                self._queued = []
            if not self._queued:
                self._loop = loop
                loop.call_soon(self.flush, client)
            self._queued.append(item)
        return item

    def withdraw(self, client: Writer, item: Queued) -> bool:
        """Take ``item`` back if it was not written yet; whether it is certainly unsent."""
        with client._send_lock:
            if item in self._queued:
                self._queued.remove(item)
                item.unsent = True
            return item.unsent

    def flush(self, client: Writer) -> None:
        """Write what is queued, now. Also called from other threads, before a frame that must
        follow the requests (a kill of a command whose request may still be queued)."""
        with client._send_lock:
            batch, self._queued = self._queued, []
            if not batch:
                return
            if client.broken is not None:  # the stream broke before this turn ended
                for item in batch:
                    item.unsent = True
                return
            try:
                client._stream.send(b"".join(item.frame for item in batch))
            except OSError as exc:
                batch[0].unsent = len(batch) == 1
                client._break(f"exec helper stream failed: {exc}")
