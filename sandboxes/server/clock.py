"""What time it is, for the service's TTLs: one seam, so a test can move time forward instead of
sleeping until a sandbox expires (tests/server's ``ManualClock``), while the service runs on the
wall clock."""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "WallClock"]


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch, as `time.time` counts them (expiries are stored that way)."""
        ...


class WallClock:
    """The real time: what the service runs on."""

    def now(self) -> float:
        return time.time()
