"""A sandbox's bandwidth (`ByteRate`): a token bucket of bytes that every connection of the
sandbox takes from, both directions together, so it moves at most ``rate`` bytes a second on
average, with at most ``burst`` at once; and its relayed connections (`RelayLimits`): at most so
many open at once, past which one more is refused. Each sandbox has its own: one that is held
back waits alone, and no other sandbox's connection waits for it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator

__all__ = ["ByteRate", "RelayBusy", "RelayLimits"]


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


class RelayBusy(Exception):
    """The sandbox has as many relayed connections open as its template allows."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the sandbox has {limit} relayed connections open, its template's most (relay_connections): "
            "retry once one of them closed"
        )
        self.limit = limit


class RelayLimits:
    """At most ``connections`` held at once (`hold`), and ``rate`` bytes a second shared by
    all of them (`paced`; ``None``: unbounded)."""

    def __init__(self, connections: int, rate: ByteRate | None = None) -> None:
        if connections < 1:
            raise ValueError("a sandbox relays at least one connection")
        self.connections = connections
        self.rate = rate
        self.open = 0

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """One connection's slot for the ``with`` body; `RelayBusy` when none is free."""
        if self.open >= self.connections:
            raise RelayBusy(self.connections)
        self.open += 1
        try:
            yield
        finally:
            self.open -= 1

    async def paced(self, size: int) -> None:
        """Return once ``size`` more bytes may pass (at once without a rate)."""
        if self.rate is not None and size:
            await self.rate.take(size)
