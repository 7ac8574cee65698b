"""The shared backends' records of every tenant's sandboxes, as a signed ``/files`` request
looks its sandbox up among them (`sandboxes.server.e2b.signed`): that endpoint needs no
credential, so the records are read at most once per `INTERVAL` whoever asks, and the requests
that ask while a read runs share it."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["INTERVAL", "Recorded", "RecordedSandboxes"]

INTERVAL = 1.0
"""Seconds between two reads of the records, at least."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """One recorded sandbox and its envd access token."""

    tenant: str
    sandbox_id: str
    token: str


class RecordedSandboxes:
    """The last read of the records; a new one starts only `INTERVAL` after the last started."""

    def __init__(self, interval: float = INTERVAL) -> None:
        self._interval = interval
        self._started = -math.inf
        self._last: list[Recorded] = []
        self._flight: asyncio.Future[list[Recorded]] | None = None

    async def read(self, fetch: Callable[[], Awaitable[list[Recorded]]]) -> list[Recorded]:
        """The records as ``fetch`` reads them: the read in flight, else the last one if it
        started within the interval, else a new one."""
        if self._flight is None:
            now = time.monotonic()
            if now - self._started < self._interval:
                return self._last
            self._started = now
            self._flight = asyncio.ensure_future(fetch())
            self._flight.add_done_callback(self._landed)
        return await asyncio.shield(self._flight)  # a request that leaves does not cancel the others'

    def _landed(self, read: asyncio.Future[list[Recorded]]) -> None:
        self._flight = None
        if not read.cancelled() and read.exception() is None:
            self._last = read.result()
