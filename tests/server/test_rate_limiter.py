"""The per-tenant token bucket, on an injected clock: the refill is arithmetic, not a wait."""

from __future__ import annotations

import pytest

from sandboxes.server.auth import RateLimiter, Tenant
from sandboxes.server.errors import ServiceError
from sandboxes.server.settings import TenantPolicy


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _refused(limiter: RateLimiter, tenant: Tenant) -> ServiceError:
    with pytest.raises(ServiceError) as raised:
        limiter.check(tenant)
    assert raised.value.code == "rate_limited"
    return raised.value


def test_the_burst_then_a_refusal_saying_when_to_retry() -> None:
    clock = _Clock()
    limiter = RateLimiter(clock)
    slow = Tenant("slow", TenantPolicy(rate=2, burst=3))
    for _ in range(3):
        limiter.check(slow)
    refused = _refused(limiter, slow)
    assert refused.headers == {"Retry-After": "1"}  # half a second, rounded up
    assert "retry in 0.50s" in refused.message


def test_tokens_come_back_at_the_rate_and_no_faster() -> None:
    clock = _Clock()
    limiter = RateLimiter(clock)
    slow = Tenant("slow", TenantPolicy(rate=2, burst=3))
    for _ in range(3):
        limiter.check(slow)
    clock.now += 0.49
    _refused(limiter, slow)
    clock.now += 0.02  # 0.51 s: one token
    limiter.check(slow)
    _refused(limiter, slow)
    clock.now += 100  # never more than the burst
    for _ in range(3):
        limiter.check(slow)
    _refused(limiter, slow)


def test_each_tenant_has_its_own_bucket() -> None:
    limiter = RateLimiter(_Clock())
    slow, other = Tenant("slow", TenantPolicy(rate=1, burst=1)), Tenant("other", TenantPolicy(rate=1, burst=1))
    limiter.check(slow)
    _refused(limiter, slow)
    limiter.check(other)
