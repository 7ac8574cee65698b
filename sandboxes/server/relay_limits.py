"""Each sandbox's relayed connections, bounded (`RelayLimits`): previews, WebSockets, port
tunnels and egress connections of one sandbox together hold at most the template's
``relay_connections`` at once (one more is refused at once, never queued: `RelayBusy`), and
their bytes, both ways, take from one token bucket of ``relay_bytes_per_second``.

One sandbox's limits are its alone (`limits_for`): a sandbox at its cap or held back by its rate
waits alone, and no other sandbox's connection, nor any command (the helper's own flow
control keeps a relay to its window), waits for it.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from sandboxes.server.egress.rate import ByteRate, RelayBusy, RelayLimits
from sandboxes.server.entry import Entry
from sandboxes.server.errors import ServiceError

__all__ = ["RelayBusy", "RelayLimits", "hold_relay", "limits_for", "limits_of", "paced"]


_limits: weakref.WeakKeyDictionary[Any, RelayLimits] = weakref.WeakKeyDictionary()
"""Sandbox object -> its limits, for as long as the object lives."""


def limits_of(sandbox: Any, template: Any) -> RelayLimits:
    """``sandbox``'s limits, made from its ``template``'s ``relay_connections`` and
    ``relay_bytes_per_second`` the first time (on the event loop: `ByteRate` is asyncio's)."""
    found = _limits.get(sandbox)
    if found is None:
        rate = template.relay_bytes_per_second
        found = RelayLimits(template.relay_connections, None if rate is None else ByteRate(rate))
        _limits[sandbox] = found
    return found


def limits_for(sandbox: Any) -> RelayLimits | None:
    """``sandbox``'s limits if `limits_of` made them."""
    return _limits.get(sandbox)


def hold_relay(entry: Entry, port: int) -> contextlib.AsyncExitStack:
    """One of the sandbox's relayed connections, held until the stack closes; past its
    template's ``relay_connections``, ``rate_limited`` (429) with a ``Retry-After``."""
    held = contextlib.AsyncExitStack()
    try:
        held.enter_context(limits_of(entry.sandbox, entry.backend.template).hold())
    except RelayBusy as busy:
        message = f"port {port} of sandbox {entry.state.id} refused: {busy}"
        raise ServiceError("rate_limited", message, status=429, headers={"Retry-After": "1"}) from busy
    return held


class _PacedReader:
    """A relay's reading half whose bytes pass at the sandbox's rate."""

    def __init__(self, reader: Any, limits: RelayLimits) -> None:
        self._reader, self._limits = reader, limits

    async def read(self, size: int = 64 << 10) -> bytes:
        data: bytes = await self._reader.read(size)
        await self._limits.paced(len(data))
        return data


class _PacedWriter:
    """A relay's writing half whose bytes pass at the sandbox's rate (counted at `drain`)."""

    def __init__(self, writer: Any, limits: RelayLimits) -> None:
        self._writer, self._limits = writer, limits
        self._written = 0

    def write(self, data: bytes) -> None:
        self._written += len(data)
        self._writer.write(data)

    async def drain(self) -> None:
        written, self._written = self._written, 0
        await self._limits.paced(written)
        await self._writer.drain()

    def write_eof(self) -> None:
        self._writer.write_eof()

    def close(self) -> None:
        self._writer.close()


def paced(connection: tuple[Any, Any], limits: RelayLimits | None) -> tuple[Any, Any]:
    """A relay's halves, at the sandbox's rate when it has limits."""
    if limits is None:
        return connection
    return _PacedReader(connection[0], limits), _PacedWriter(connection[1], limits)
