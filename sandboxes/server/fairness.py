"""Per-tenant lanes for file operations: one tenant's operations that block in its sandboxes
hold at most its policy's ``max_file_operations`` of the service's worker threads, so another
tenant's ``ls`` or ``read`` never waits behind them.

A tenant's operation past its cap waits for one of its own to end, at most `QUEUE_WAIT`
seconds, then is refused with ``rate_limited`` (429, ``Retry-After``). A slot is held until the
thread running the operation has returned, not merely until its request ended: a client that
leaves does not free a thread still blocked in its sandbox.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from typing import TypeVar

from sandboxes.server.errors import ServiceError

__all__ = ["QUEUE_WAIT", "FileLanes"]

T = TypeVar("T")

QUEUE_WAIT = 10.0
"""Seconds a tenant's file operation past its cap waits for one of the tenant's own to end."""


class FileLanes:
    """File operations running at once, per tenant, each in a worker thread of the loop's
    default executor; at most the tenant's cap of them hold a thread at any time."""

    def __init__(self) -> None:
        self._lanes: dict[str, asyncio.Semaphore] = {}

    async def run(self, tenant: str, cap: int, call: Callable[[], T]) -> T:
        """``call()`` in a worker thread once the tenant has a free slot of its ``cap``."""
        lane = self._lanes.setdefault(tenant, asyncio.Semaphore(cap))
        try:
            await asyncio.wait_for(lane.acquire(), QUEUE_WAIT)
        except TimeoutError:
            raise ServiceError(
                "rate_limited",
                f"tenant {tenant!r} already runs {cap} file operations at once, its maximum, "
                f"and none ended within {QUEUE_WAIT:g} s; retry when one ends",
                headers={"Retry-After": "1"},
            ) from None
        try:
            # The context goes along, as to_thread would take it, so log lines carry the request id.
            bound = functools.partial(contextvars.copy_context().run, call)
            work = asyncio.get_running_loop().run_in_executor(None, bound)
        except BaseException:
            lane.release()
            raise
        work.add_done_callback(lambda _: lane.release())
        return await asyncio.shield(work)  # a request cancelled leaves the slot to the thread
