"""The shared backends' records of every tenant's sandboxes, as a signed ``/files`` request
looks its sandbox up among them (`sandboxes.server.e2b.signed`): that endpoint needs no
credential, so a read of the records starts at most once per `INTERVAL` whoever asks, and the
requests that want a read started by a given moment share one.

A request asks first for a read started within `INTERVAL` before it arrived (the last one, as a
rule), and, if its sandbox is not there, for one started after it arrived: a sandbox another
replica made a moment ago is in that one. Such a request waits for the next read the bound lets
start (`INTERVAL` at most, plus the read) rather than being refused, and a stream of bogus
signatures shares those reads: the engine is read once per `INTERVAL` at most, however many
requests miss."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["INTERVAL", "Read", "Recorded", "RecordedSandboxes"]

INTERVAL = 1.0
"""Seconds between the starts of two reads of the records, at least."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """One recorded sandbox and its envd access token."""

    tenant: str
    sandbox_id: str
    token: str


@dataclass(frozen=True, slots=True)
class Read:
    """The records as one read found them, and when (`time.monotonic`) that read started."""

    started: float
    sandboxes: list[Recorded]


_NONE = Read(-math.inf, [])


class RecordedSandboxes:
    """The last read of the records and the one in flight; a read starts only `INTERVAL` after
    the last one started, and only when none is in flight."""

    def __init__(self, interval: float = INTERVAL) -> None:
        self._interval = interval
        self._started = -math.inf
        self._last = _NONE
        self._flight: tuple[float, asyncio.Future[list[Recorded]]] | None = None

    async def read(self, since: float, fetch: Callable[[], Awaitable[list[Recorded]]]) -> Read:
        """The records as a read that started at ``since`` or later found them (``since`` a
        `time.monotonic` reading): the last one, or the one in flight, if it did; else the next
        one, which starts (``fetch``) as soon as the interval and the read in flight allow."""
        while True:
            if self._flight is not None:
                started, flight = self._flight
                if started >= since:
                    return Read(started, await asyncio.shield(flight))  # a request that leaves cancels no read
                await asyncio.wait([flight])  # too old for this request: the next one, once it lands
            elif self._last.started >= since:
                return self._last
            elif (wait := self._started + self._interval - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            else:
                self._start(fetch)

    def _start(self, fetch: Callable[[], Awaitable[list[Recorded]]]) -> None:
        started = self._started = time.monotonic()
        flight = asyncio.ensure_future(fetch())
        self._flight = (started, flight)
        flight.add_done_callback(lambda done: self._landed(started, done))

    def _landed(self, started: float, read: asyncio.Future[list[Recorded]]) -> None:
        self._flight = None
        if not read.cancelled() and read.exception() is None:
            self._last = Read(started, read.result())
