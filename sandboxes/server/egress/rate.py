"""A sandbox's egress bandwidth (`ByteRate`): a token bucket of bytes that every connection of
the sandbox takes from, both directions together, so its egress moves at most ``rate`` bytes a
second on average, with at most ``burst`` at once. Each sandbox has its own: one that is held
back waits alone, and no other sandbox's connection waits for it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

__all__ = ["ByteRate"]


class ByteRate:
    """``rate`` bytes a second, ``burst`` (default: one second's) at once. A take larger than
    what is there leaves a debt that the taker waits out, so chunks of any size pass."""

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError("a byte rate is positive")
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else rate)
        self._clock, self._sleep = clock, sleep
        self._tokens = self.burst
        self._stamp = clock()
        self._turn = asyncio.Lock()
        """Takers go one at a time, in the order they came (asyncio's lock is FIFO)."""

    async def take(self, size: int) -> None:
        """Return once ``size`` bytes may pass."""
        async with self._turn:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= size
            if self._tokens < 0:
                await self._sleep(-self._tokens / self.rate)
