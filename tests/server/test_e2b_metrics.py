"""The real E2B SDK's ``get_metrics`` (sync and async) against the service's E2B API, over the
local jail and over Docker: the samples the service keeps, in E2B's shape."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from e2b import AsyncSandbox, Sandbox, SandboxNotFoundException
from e2b_harness import service_fixture
from service_harness import KEYS, Running
from support import SESSION_OWNER, wait_for

CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}


service = service_fixture("e2bm", cpus=2, sample_interval=0.2)


def _opts(service: Running, tenant: str = "alice") -> dict[str, Any]:
    return {"api_key": KEYS[tenant], "api_url": f"{service.url}/e2b", "sandbox_url": f"{service.url}/e2b/envd"}


def test_get_metrics_answers_the_kept_samples(service: Running) -> None:
    sandbox = Sandbox.create(**_opts(service))
    try:
        sandbox.commands.run("true")  # the exec helper runs: sampling starts
        wait_for(lambda: len(sandbox.get_metrics()) >= 2, "two samples through the SDK", limit=30)
        metrics = sandbox.get_metrics()
        latest = metrics[-1]
        cpus = round(service.registry.backends["default"].template.cpus) or 1
        assert latest.cpu_count == max(1, cpus)
        assert latest.mem_used > 0
        assert latest.disk_total > 0
        assert 0 <= latest.disk_used <= latest.disk_total
        assert latest.cpu_used_pct >= 0
        assert abs(latest.timestamp.timestamp() - datetime.now(UTC).timestamp()) < 60
        assert [m.timestamp for m in metrics] == sorted(m.timestamp for m in metrics)
        later = sandbox.get_metrics(start=datetime.fromtimestamp(latest.timestamp.timestamp() + 3600, UTC))
        assert later == []
        same = Sandbox.get_metrics(sandbox.sandbox_id, **_opts(service))  # the class method
        assert same[: len(metrics)][0].timestamp == metrics[0].timestamp

        async def async_metrics() -> int:
            connected = await AsyncSandbox.connect(sandbox.sandbox_id, **_opts(service))
            return len(await connected.get_metrics())

        assert asyncio.run(async_metrics()) >= 2
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_metrics(sandbox.sandbox_id, **_opts(service, "bob"))
    finally:
        sandbox.kill()
