"""File watches through the service (`sandboxes.watching`, on the sandbox's exec helper): a
streamed watch (``GET .../watch``: NDJSON of `api.WatchEvent`) and polled watchers
(``POST .../watchers``; ``GET .../watchers/{id}/events`` drains what they queued, at most
`POLLED_QUEUE` events and one ``overflow``; ``DELETE`` removes one, and so does
``watcher_idle`` seconds without a poll). A tenant holds at most its ``max_watchers`` of both
at once: one more is refused with ``rate_limited``.

A stream starts with a ``start`` line once the watch is in place, sends a ``keepalive`` line
whenever nothing else was sent for the keep-alive interval (so a proxy never sees an idle
connection), and ends with an ``end`` line when the watch ended by itself (its directory
removed, the sandbox gone); a client that leaves ends the watch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from sandboxes import api
from sandboxes.server.errors import ServiceError
from sandboxes.server.logs import unique_id
from sandboxes.watching import Watcher, WatchError, awatch

__all__ = ["POLLED_QUEUE", "STREAMED_QUEUE", "Watches"]

POLLED_QUEUE = 1024
"""Events a polled watcher keeps between two polls."""
STREAMED_QUEUE = 4096
"""Events a streamed watch holds while its client reads slower than they come."""
_STATUS = {"unavailable": 501, "timeout": 504, "connection_lost": 503}


@dataclass
class _Polled:
    tenant: str
    sandbox_id: str
    watcher: Watcher
    expiry: asyncio.TimerHandle | None = None


class Watches:
    """The watches open in this replica: each tenant's count, and the polled watchers by id."""

    def __init__(self) -> None:
        self._open: dict[str, int] = {}
        self._polled: dict[str, _Polled] = {}

    async def _start(
        self,
        tenant: str,
        cap: int,
        sandbox: object,
        path: str,
        recursive: bool,
        queued: int,
        lifetime: float | None = None,
    ) -> Watcher:
        """A watch counted against the tenant's ``cap`` until `_release`d, ending after ``lifetime`` seconds."""
        if self._open.get(tenant, 0) >= cap:
            raise ServiceError(
                "rate_limited",
                f"tenant {tenant!r} already has {cap} file watches open, its maximum; remove one first",
                headers={"Retry-After": "1"},
            )
        self._open[tenant] = self._open.get(tenant, 0) + 1
        try:
            return await awatch(sandbox, path, recursive=recursive, timeout=lifetime, max_queued=queued)
        except WatchError as exc:
            self._release(tenant)
            raise ServiceError(exc.code, exc.message, status=_STATUS.get(exc.code)) from exc
        except BaseException:
            self._release(tenant)
            raise

    def _release(self, tenant: str) -> None:
        left = self._open.pop(tenant, 1) - 1
        if left > 0:
            self._open[tenant] = left

    async def stream(
        self,
        tenant: str,
        cap: int,
        sandbox: object,
        path: str,
        recursive: bool,
        keepalive: float,
        lifetime: float | None = None,
    ) -> AsyncIterator[bytes]:
        """NDJSON lines of the watch of ``path`` (see the module's docstring), once it is in place."""
        return _lines(await self.follow(tenant, cap, sandbox, path, recursive, keepalive, lifetime))

    async def follow(
        self,
        tenant: str,
        cap: int,
        sandbox: object,
        path: str,
        recursive: bool,
        keepalive: float,
        lifetime: float | None = None,
    ) -> AsyncGenerator[api.WatchEvent]:
        """The events of a streamed watch of ``path``, once it is in place: ``start``, what
        happens, a ``keepalive`` after ``keepalive`` quiet seconds, and ``end`` if it ended by
        itself (after ``lifetime`` seconds, say). Closing the iteration ends the watch."""
        watcher = await self._start(tenant, cap, sandbox, path, recursive, STREAMED_QUEUE, lifetime)
        events = self._events(tenant, watcher, keepalive)
        first = await anext(events)  # inside its ``try``: its ``finally`` now runs however it ends
        return _chained(first, events)

    async def _events(self, tenant: str, watcher: Watcher, keepalive: float) -> AsyncGenerator[api.WatchEvent]:
        try:
            yield api.WatchEvent(type="start")
            while True:
                try:
                    event = await asyncio.wait_for(anext(watcher, None), keepalive)
                except TimeoutError:
                    yield api.WatchEvent(type="keepalive")
                    continue
                if event is None:
                    yield api.WatchEvent(type="end", error=watcher.error, message=watcher.message)
                    return
                yield event
        finally:  # the client left, or the watch ended
            watcher.stop()
            self._release(tenant)

    async def create(
        self, tenant: str, cap: int, sandbox_id: str, sandbox: object, body: api.CreateWatcher, idle: float
    ) -> api.WatcherInfo:
        """A polled watcher of ``body.path``, in place once answered."""
        watcher = await self._start(tenant, cap, sandbox, body.path, body.recursive, POLLED_QUEUE)
        ident = unique_id()
        self._polled[ident] = polled = _Polled(tenant, sandbox_id, watcher)
        self._expire_after(ident, polled, idle)
        return api.WatcherInfo(id=ident)

    def drain(self, tenant: str, sandbox_id: str, ident: str, idle: float) -> api.WatcherEvents:
        """The events the watcher queued since the last poll (taken from it)."""
        polled = self._find(tenant, sandbox_id, ident)
        self._expire_after(ident, polled, idle)
        watcher = polled.watcher
        ended = watcher.ended  # before draining: an end seen now comes with every event before it
        events = []
        while (event := watcher.get(0)) is not None:
            events.append(event)
        return api.WatcherEvents(events=events, ended=ended, error=watcher.error, message=watcher.message)

    def remove(self, tenant: str, sandbox_id: str, ident: str) -> None:
        self._find(tenant, sandbox_id, ident)
        self._drop(ident)

    def _find(self, tenant: str, sandbox_id: str, ident: str) -> _Polled:
        polled = self._polled.get(ident)
        if polled is None or polled.tenant != tenant or polled.sandbox_id != sandbox_id:
            raise ServiceError("not_found", f"no file watcher {ident!r} in this sandbox (removed, or idle too long)")
        return polled

    def _expire_after(self, ident: str, polled: _Polled, idle: float) -> None:
        if polled.expiry is not None:
            polled.expiry.cancel()
        polled.expiry = asyncio.get_running_loop().call_later(idle, self._drop, ident)

    def _drop(self, ident: str) -> None:
        polled = self._polled.pop(ident, None)
        if polled is None:
            return
        if polled.expiry is not None:
            polled.expiry.cancel()
        with contextlib.suppress(Exception):  # a broken helper: the watch is gone with it
            polled.watcher.stop()
        self._release(polled.tenant)


async def _chained(first: api.WatchEvent, rest: AsyncGenerator[api.WatchEvent]) -> AsyncGenerator[api.WatchEvent]:
    try:
        yield first
        async for event in rest:
            yield event
    finally:
        await rest.aclose()


async def _lines(events: AsyncGenerator[api.WatchEvent]) -> AsyncIterator[bytes]:
    try:
        async for event in events:
            yield _line(event)
    finally:  # at once, not when the generator is collected: the watch ends with its stream
        await events.aclose()


def _line(event: api.WatchEvent) -> bytes:
    """The event's JSON line, without the fields it does not carry."""
    return event.model_dump_json(exclude_none=True).encode("utf-8") + b"\n"
