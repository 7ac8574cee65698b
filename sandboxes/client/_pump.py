"""The one read loop of every stream the client follows (a command's output, a watch, a
terminal), once per flavour: `pump` for threads, `apump` for an event loop.

What a stream means lives in a `Reader`, free of I/O: fed what its connection gave (``None``
at the connection's end), it says what to hand out and when it is done. The drivers only
receive, feed and hand out; a failure of the connection (one of ``errors``) goes to the
reader's `Reader.broke` and ends the loop. Each received item is fed before the next is
received, so a reader sees the connection's bytes in order and bounds them as they arrive.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from typing import Protocol, TypeVar

__all__ = ["Reader", "apump", "pump"]

R_contra = TypeVar("R_contra", contravariant=True)
Y_co = TypeVar("Y_co", covariant=True)
R = TypeVar("R")
Y = TypeVar("Y")


class Reader(Protocol[R_contra, Y_co]):
    """A stream's meaning, free of I/O: what each received item gives, and when it is done."""

    @property
    def done(self) -> bool:
        """Whether the stream is over for this loop: nothing more is received once it is."""
        ...

    def feed(self, received: R_contra | None) -> Y_co | None:
        """What ``received`` gives the caller (``None``: nothing); ``None`` received is the
        connection's end."""
        ...

    def broke(self, exc: Exception) -> None:
        """Receiving raised ``exc``, one of the loop's ``errors``: the loop ends after this."""
        ...


def pump(reader: Reader[R, Y], receive: Callable[[], R | None], errors: tuple[type[Exception], ...]) -> Generator[Y]:
    """What ``reader`` makes of what ``receive`` returns, until it is done or receiving fails."""
    while not reader.done:
        try:
            received = receive()
        except errors as exc:
            reader.broke(exc)
            return
        item = reader.feed(received)
        if item is not None:
            yield item


async def apump(
    reader: Reader[R, Y], receive: Callable[[], Awaitable[R | None]], errors: tuple[type[Exception], ...]
) -> AsyncGenerator[Y]:
    """`pump` on an event loop: ``receive`` is awaited."""
    while not reader.done:
        try:
            received = await receive()
        except errors as exc:
            reader.broke(exc)
            return
        item = reader.feed(received)
        if item is not None:
            yield item
