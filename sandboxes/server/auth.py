"""Who is calling (Bearer API keys, stored as SHA-256 only) and how fast they may call.

A key is checked against every configured digest with `hmac.compare_digest`, never stopping
early, so the time a refusal takes says nothing about how close a guess was or which entry
matched. The rate limit is a token bucket per tenant, kept in memory: a restart refills it; so is the
count of each tenant's running commands (`CommandSlots`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import math
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from sandboxes.api import PTY_BEARER_PREFIX
from sandboxes.server.errors import ServiceError
from sandboxes.server.settings import ServiceSettings, TenantPolicy

ANONYMOUS = "anonymous"
"""The tenant of every request to a service started ``insecure`` without keys."""


def hash_key(key: str) -> str:
    """What the configuration stores for ``key``."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def generate_key() -> str:
    return "sbx_" + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class Tenant:
    id: str
    policy: TenantPolicy


class Authenticator:
    def __init__(self, settings: ServiceSettings) -> None:
        self._settings = settings
        self._digests = [(bytes.fromhex(digest), tenant) for digest, tenant in settings.api_keys.items()]
        self.open = not self._digests and settings.insecure
        """No keys configured and started insecure: everyone is `ANONYMOUS`."""

    def authenticate(self, authorization: str | None) -> Tenant:
        if self.open:
            return Tenant(ANONYMOUS, self._settings.policy_for(ANONYMOUS))
        scheme, _, key = (authorization or "").partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise _unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        presented = hashlib.sha256(key.encode("utf-8")).digest()
        found: str | None = None
        for digest, tenant in self._digests:
            if hmac.compare_digest(presented, digest):
                found = tenant
        if found is None:
            raise _unauthorized("invalid API key")
        return Tenant(found, self._settings.policy_for(found))


AUTHENTICATED = "authenticated"
"""Key in a request's ``scope["state"]`` of its `Tenant`, once `request_tenant` found it."""


def request_tenant(auth: Authenticator, scope: MutableMapping[str, Any]) -> Tenant:
    """The tenant of an ASGI request, authenticated from its first ``Authorization`` header once:
    the request middleware asks before a byte of the body is read, every route after it finds
    the answer in the request's state."""
    state = scope.setdefault("state", {})
    tenant = state.get(AUTHENTICATED)
    if isinstance(tenant, Tenant):
        return tenant
    header = next((value for key, value in scope["headers"] if key == b"authorization"), None)
    tenant = auth.authenticate(None if header is None else header.decode("latin-1"))
    state[AUTHENTICATED] = tenant
    state["tenant"] = tenant.id
    return tenant


def websocket_tenant(auth: Authenticator, scope: MutableMapping[str, Any]) -> Tenant:
    """The tenant of a WebSocket request: its ``Authorization`` header, else the key a client
    that cannot set headers (a browser) offers as a ``bearer.<key>`` subprotocol; never the
    URL's query, which logs and proxies keep."""
    header = next((value.decode("latin-1") for key, value in scope["headers"] if key == b"authorization"), None)
    if header is None:
        offered = [name for name in scope.get("subprotocols", ()) if name.startswith(PTY_BEARER_PREFIX)]
        header = f"Bearer {offered[0][len(PTY_BEARER_PREFIX) :]}" if offered else None
    tenant = auth.authenticate(header)
    state = scope.setdefault("state", {})
    state[AUTHENTICATED] = tenant
    state["tenant"] = tenant.id
    return tenant


def _unauthorized(message: str) -> ServiceError:
    return ServiceError("unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


class RateLimiter:
    """One token bucket per tenant: ``burst`` tokens, refilled at ``rate`` per second.
    ``clock`` (seconds, monotonic) is injectable so the refill is tested without waiting."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def check(self, tenant: Tenant) -> None:
        """Take a token for one request, or refuse with ``rate_limited`` and a Retry-After."""
        rate, burst = tenant.policy.rate, float(tenant.policy.burst)
        now = self._clock()
        with self._lock:
            tokens, last = self._buckets.get(tenant.id, (burst, now))
            tokens = min(burst, tokens + (now - last) * rate)
            if tokens < 1.0:
                self._buckets[tenant.id] = (tokens, now)
                wait = (1.0 - tokens) / rate
                raise ServiceError(
                    "rate_limited",
                    f"tenant {tenant.id!r} exceeds {rate:g} requests/s; retry in {wait:.2f}s",
                    headers={"Retry-After": str(max(1, math.ceil(wait)))},
                )
            self._buckets[tenant.id] = (tokens - 1.0, now)


class CommandSlots:
    """Commands running at once, per tenant, against its policy's ``max_commands``; one past it
    waits its turn (first come, first served) while the tenant's queue moves, and is refused
    only once none of the tenant's commands ended for the whole wait.

    Each running command holds a thread until it ends, so one tenant with commands that never
    end would otherwise take every thread and stall everyone else's. A slot that ends while
    others wait passes straight to the first of them, so a newcomer never overtakes a waiter.
    A burst of a tenant's commands longer than the wait is served as long as its commands keep
    ending: waiting helps there; it cannot once they all hang, which is when one is refused."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._running: dict[str, int] = {}
        self._waiting: dict[str, deque[_Waiter]] = {}
        self._ended: dict[str, float] = {}
        """Per tenant with waiters: when one of its commands last ended (``clock`` seconds)."""
        self._clock = clock
        self._lock = threading.Lock()

    def take(self, tenant: str, policy: TenantPolicy) -> Callable[[], None]:
        """A slot for one command now, or ``rate_limited``; call what is returned (once, from
        any thread) when the command has ended."""
        with self._lock:
            if not self._free(tenant, policy):
                raise _busy(tenant, self._running.get(tenant, 0))
            self._running[tenant] = self._running.get(tenant, 0) + 1
        return self._release_of(tenant)

    async def acquire(self, tenant: str, policy: TenantPolicy, wait: float) -> Callable[[], None]:
        """A slot for one command, waiting for one to be freed until ``wait`` seconds pass with
        none of the tenant's commands ending, then ``rate_limited`` with a ``Retry-After``;
        what is returned is called as `take`'s is."""
        if wait <= 0:
            return self.take(tenant, policy)
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free(tenant, policy):
                self._running[tenant] = self._running.get(tenant, 0) + 1
                return self._release_of(tenant)
            waiter = _Waiter(loop, loop.create_future())
            self._waiting.setdefault(tenant, deque()).append(waiter)
            self._ended.setdefault(tenant, self._clock())
        try:
            await self._wait_while_moving(tenant, waiter, wait)
        except BaseException:  # the request was abandoned: give back what it may have been handed
            if not self._withdraw(tenant, waiter):
                self._release_of(tenant)()
            raise
        if self._withdraw(tenant, waiter):
            raise _busy(tenant, self.running(tenant), waited=wait)
        return self._release_of(tenant)  # handed over (perhaps just as the time ran out)

    async def _wait_while_moving(self, tenant: str, waiter: _Waiter, wait: float) -> None:
        """Until ``waiter`` is handed a slot, or ``wait`` seconds passed since the tenant's
        last command ended (or since this waiter came, if later)."""
        came = self._clock()
        while not waiter.handed.done():
            with self._lock:
                moved = max(came, self._ended.get(tenant, came))
            left = moved + wait - self._clock()
            if left <= 0:
                return
            await asyncio.wait({waiter.handed}, timeout=left)

    def running(self, tenant: str) -> int:
        with self._lock:
            return self._running.get(tenant, 0)

    def _free(self, tenant: str, policy: TenantPolicy) -> bool:
        """Under the lock: a slot is free and nobody waits ahead."""
        return self._running.get(tenant, 0) < policy.max_commands and not self._waiting.get(tenant)

    def _withdraw(self, tenant: str, waiter: _Waiter) -> bool:
        """Take ``waiter`` out of the queue; ``False`` if a slot was handed to it already."""
        with self._lock:
            queue = self._waiting.get(tenant)
            if queue is None or waiter not in queue:
                return False
            queue.remove(waiter)
            if not queue:
                del self._waiting[tenant]
                self._ended.pop(tenant, None)
            return True

    def _release_of(self, tenant: str) -> Callable[[], None]:
        released = threading.Event()

        def release() -> None:
            if released.is_set():
                return
            released.set()
            self._free_one(tenant)

        return release

    def _free_one(self, tenant: str) -> None:
        """A command ended: its slot goes to the first waiter, else back to the tenant."""
        with self._lock:
            queue = self._waiting.get(tenant)
            if queue:
                self._ended[tenant] = self._clock()
                waiter = queue.popleft()
                if not queue:
                    del self._waiting[tenant]
                    del self._ended[tenant]
            else:
                waiter = None
                left = self._running.get(tenant, 1) - 1
                if left > 0:
                    self._running[tenant] = left
                else:
                    self._running.pop(tenant, None)
        if waiter is not None:
            with contextlib.suppress(RuntimeError):  # its loop closed: the service is stopping
                waiter.loop.call_soon_threadsafe(_handed, waiter.handed)


@dataclass(frozen=True, slots=True, eq=False)
class _Waiter:
    """A command waiting for a slot: the future its loop resolves when one is handed to it."""

    loop: asyncio.AbstractEventLoop
    handed: asyncio.Future[None]


def _handed(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _busy(tenant: str, running: int, *, waited: float = 0.0) -> ServiceError:
    after = f" after waiting {waited:g}s for one to end" if waited else ""
    return ServiceError(
        "rate_limited",
        f"tenant {tenant!r} already runs {running} commands at once, its maximum{after}; retry when one ends",
        headers={"Retry-After": "1"},
    )
