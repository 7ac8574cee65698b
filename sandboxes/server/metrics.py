"""Prometheus metrics of one service instance.

Each app gets its own `CollectorRegistry` rather than the process-global one, so several apps
in one process (tests, an embedding program) neither collide nor mix their numbers.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.sandboxes_live = Gauge(
            "sandboxes_live", "Sandboxes alive, by backend", ["backend"], registry=self.registry
        )
        self.create_seconds = Histogram(
            "sandboxes_create_seconds",
            "Time to create a sandbox, by backend",
            ["backend"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.execute_seconds = Histogram(
            "sandboxes_execute_seconds",
            "Time of an execute request, by backend and mode (sync, stream)",
            ["backend", "mode"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.errors = Counter(
            "sandboxes_errors_total", "Requests refused or failed, by error code", ["code"], registry=self.registry
        )
        self.requests = Counter(
            "sandboxes_requests_total", "Requests answered, by status class", ["status"], registry=self.registry
        )
        self.pool_ready = Gauge(
            "sandboxes_pool_ready",
            "Pooled sandboxes ready to be claimed, by template",
            ["template"],
            registry=self.registry,
        )
        self.expired = Counter("sandboxes_expired_total", "Sandboxes deleted by their TTL", registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
