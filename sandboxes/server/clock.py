"""What time it is, for the service's TTLs: one seam, so a test can move time forward instead of
sleeping until a sandbox expires (`ManualClock`), while the service runs on the wall clock."""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "WallClock"]


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch, as `time.time` counts them (expiries are stored that way)."""
        ...


class WallClock:
    """The real time: what the service runs on."""

    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told to (`advance`), from the wall clock's time at creation.

    Expiry decisions follow it; the per-sandbox timers still wait real seconds, so with this clock
    a sandbox expires when a sweep runs after `advance` has moved past its expiry."""

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (never back: expiries only pass); the new time."""
        if seconds < 0:
            raise ValueError("a clock does not go back")
        with self._lock:
            self._now += seconds
            return self._now
