"""Who is calling (Bearer API keys, stored as SHA-256 only) and how fast they may call.

A key is checked against every configured digest with `hmac.compare_digest`, never stopping
early, so the time a refusal takes says nothing about how close a guess was or which entry
matched. The rate limit is a token bucket per tenant, kept in memory: a restart refills it; so is the
count of each tenant's running commands (`CommandSlots`).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

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
    """Commands running at once, per tenant, against its policy's ``max_commands``.

    Each running command holds a thread until it ends, so one tenant with commands that never
    end would otherwise take every thread and stall everyone else's."""

    def __init__(self) -> None:
        self._running: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, tenant: str, policy: TenantPolicy) -> Callable[[], None]:
        """A slot for one command, or ``rate_limited``; call what is returned (once, from any
        thread) when the command has ended."""
        with self._lock:
            running = self._running.get(tenant, 0)
            if running >= policy.max_commands:
                raise ServiceError(
                    "rate_limited",
                    f"tenant {tenant!r} already runs {running} commands at once, its maximum; retry when one ends",
                    headers={"Retry-After": "1"},
                )
            self._running[tenant] = running + 1
        released = threading.Event()

        def release() -> None:
            if released.is_set():
                return
            released.set()
            with self._lock:
                left = self._running.get(tenant, 1) - 1
                if left > 0:
                    self._running[tenant] = left
                else:
                    self._running.pop(tenant, None)

        return release

    def running(self, tenant: str) -> int:
        with self._lock:
            return self._running.get(tenant, 0)
