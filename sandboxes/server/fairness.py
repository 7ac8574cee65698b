"""Per-tenant lanes for file operations: one tenant's operations that block in its sandboxes
hold at most its policy's ``max_file_operations`` threads, taken from threads of their own, as
many as the tenants' caps together (`file_threads`): so another tenant's ``ls`` or ``read``, and
the service's other blocking calls (its worker threads), never wait behind them.

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
from concurrent.futures import Executor
from typing import TypeVar

from sandboxes.server.auth import ANONYMOUS
from sandboxes.server.errors import ServiceError
from sandboxes.server.settings import ServiceSettings

__all__ = ["QUEUE_WAIT", "FileLanes", "file_threads"]

T = TypeVar("T")

QUEUE_WAIT = 10.0
"""Seconds a tenant's file operation past its cap waits for one of the tenant's own to end."""


def file_threads(settings: ServiceSettings) -> int:
    """Threads enough for every tenant's cap of file operations at once (the tenants are those
    of the API keys, or the anonymous one)."""
    tenants = set(settings.api_keys.values()) or {ANONYMOUS}
    return sum(settings.policy_for(tenant).max_file_operations for tenant in tenants)


class FileLanes:
    """File operations running at once, per tenant, each in a thread of ``executor`` (set by
    the app's lifespan to `file_threads` threads; ``None``: the loop's default); at most the
    tenant's cap of them hold a thread at any time."""

    def __init__(self) -> None:
        self._lanes: dict[str, asyncio.Semaphore] = {}
        self.executor: Executor | None = None

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
            work = asyncio.get_running_loop().run_in_executor(self.executor, bound)
        except BaseException:
            lane.release()
            raise
        work.add_done_callback(lambda _: lane.release())
        return await asyncio.shield(work)  # a request cancelled leaves the slot to the thread
