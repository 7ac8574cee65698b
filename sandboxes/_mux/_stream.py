"""What the exec helper's client needs of a transport: a byte stream (`ByteStream`, or
`TimedByteStream` where a caller may read its own answer), and the one failure it raises when
the helper or its stream is gone (`MuxBroken`), which says whether the command in hand may be
sent again. Apart from `sandboxes._mux.client` so that a transport's stream is typed against the
contract alone."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["ByteStream", "MuxBroken", "TimedByteStream"]


class ByteStream(Protocol):
    def send(self, data: bytes) -> None:
        """All of ``data``, or raise `OSError`: a send that raised has not handed on all of it."""
        ...

    def recv(self, size: int) -> bytes:
        """Up to ``size`` bytes; ``b""`` at end of stream."""
        ...

    def close(self) -> None:
        """Release the stream; a thread blocked in `recv` must wake (with ``b""`` or OSError)."""
        ...


@runtime_checkable
class TimedByteStream(ByteStream, Protocol):
    """A `ByteStream` that can also wait for data a bounded time. Over such a stream a caller
    alone with its command reads its answer itself (see `sandboxes._mux.client.MuxClient`)."""

    def recv_within(self, size: int, timeout: float | None) -> bytes | None:
        """Up to ``size`` bytes; ``b""`` at end of stream; ``None`` when nothing came within
        ``timeout`` seconds (``0``: only what is there already; ``None``: no limit). A thread
        waiting in it must wake when the stream is closed, as in `recv`."""
        ...


class MuxBroken(Exception):
    """The helper or its stream is gone; the owner should start a new one.

    ``may_resend`` is the one answer to "may the command in hand go to a fresh helper?": true
    only when no whole request of it was written (see `sandboxes._mux.client`'s docstring);
    otherwise it may have run, or may still run, and the caller answers ``connection_lost``."""

    def __init__(self, reason: str, *, may_resend: bool = False) -> None:
        super().__init__(reason)
        self.may_resend = may_resend
