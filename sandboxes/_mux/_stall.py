"""A watch on a long send to an exec helper: a helper that stops taking bytes ends the client.

Why: the client writes a command's stdin (or a file op's bytes) in whole frames, and a write
blocks once the pipes and socket buffers are full and the helper is not reading. A command can
stop its own helper (``kill -STOP``: same user), and a write that blocks does so before any
deadline of the command is looked at: the caller's thread (one of the service's, say) waited
forever. A frame is 64 KiB, which a live helper takes in well under a millisecond, so a send
that makes no progress for `STALL` seconds is a stopped helper, whatever the transfer's size or
the disk's speed: the client is closed, which fails the commands in flight (``connection_lost``:
they may have run), and closing its stream wakes the blocked write on every transport (a
socket's shutdown, a killed jail).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

__all__ = ["STALL", "SendWatch"]

STALL = 30.0
"""Seconds a watched send may go without a frame taken."""


class SendWatch:
    """``with SendWatch(on_stall) as watch:`` around a send, ``watch.sent()`` after each frame;
    ``on_stall(reason)`` is called, once, on a thread of the watch's own, if a frame stalls."""

    def __init__(self, on_stall: Callable[[str], None]) -> None:
        self._on_stall = on_stall
        self._stall = STALL
        self._frames = 0
        self._over = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="mux-send-watch", daemon=True)

    def __enter__(self) -> SendWatch:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self._over.set()

    def sent(self) -> None:
        self._frames += 1

    def _watch(self) -> None:
        """Looks four times per `STALL`: a stall is acted on within 1.25 times it."""
        seen, since = self._frames, time.monotonic()
        while not self._over.wait(self._stall / 4):
            if self._frames != seen:
                seen, since = self._frames, time.monotonic()
            elif time.monotonic() - since >= self._stall:
                self._on_stall(f"exec helper took no input for {self._stall:g}s (stopped?); closed")
                return
