"""Per-sandbox usage through the service, over the local jail and over Docker: a busy loop shows
in the CPU percent, 50 MiB allocated in the memory used; through the HTTP API, the client (sync
and async), the CLI and Prometheus; another tenant sees nothing; a sandbox whose exec helper
never ran is never started to be sampled."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from service_harness import KEYS, Running, create, execute, running, settings_for, start_process
from support import HAS_BWRAP, SESSION_OWNER, needs, wait_for

from sandboxes import api
from sandboxes.cli import main as cli_main
from sandboxes.client import AsyncSandboxClient, SandboxClient
from sandboxes.docker import DockerTemplate
from sandboxes.local import LocalTemplate

CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}
MIB = 1 << 20
BUSY = "exec python3 -c 'while True: pass'"
HOLD_50_MIB = "exec python3 -c 'import time; kept = b\"x\" * (50 << 20); time.sleep(600)'"


@pytest.fixture(scope="module", params=["local", "docker"])
def service(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    if request.param == "local":
        needs(HAS_BWRAP, "bubblewrap is not installed")
        template: Any = LocalTemplate(default_timeout=30, memory="512m")
        docker_client = None
    else:
        docker_client = request.getfixturevalue("docker_client")
        image = request.getfixturevalue("runtime_image")
        template = DockerTemplate(backend="docker", image=image, cpus=1, memory="256m", labels=CLEANUP)
    owner = f"{SESSION_OWNER}-usage-{uuid.uuid4().hex[:6]}"
    settings = settings_for(
        tmp_path_factory.mktemp("usage"), owner=owner, templates={"default": template}, sample_interval=0.2
    )
    with running(settings, docker_client=docker_client) as svc:
        yield svc


def _metrics(client: httpx.Client, sandbox_id: str) -> api.SandboxMetrics:
    response = client.get(f"/v1/sandboxes/{sandbox_id}/metrics")
    assert response.status_code == 200, response.text
    return api.SandboxMetrics.model_validate_json(response.content)


def _wait_sample(client: httpx.Client, sandbox_id: str, what: str, check: Any) -> api.MetricsSample:
    """The first latest sample ``check`` accepts, within a bounded wait (the last one seen is
    in the failure)."""
    deadline = time.monotonic() + 60
    latest = None
    while time.monotonic() < deadline:
        latest = _metrics(client, sandbox_id).latest
        if latest is not None and check(latest):
            return latest
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within 60 s; last sample: {latest}")


def test_a_busy_loop_and_50_mib_show_in_the_samples(service: Running) -> None:
    backend = service.registry.backends["default"].template.backend
    with service.client() as client:
        sandbox = create(client)
        assert execute(client, sandbox["id"], "true")["exit_code"] == 0  # the exec helper runs
        first = _wait_sample(client, sandbox["id"], "a first sample", lambda s: s.memory_used is not None)
        assert first.disk_total is not None
        assert first.disk_used is not None
        assert 0 <= first.disk_used <= first.disk_total
        assert first.cpus is not None
        assert first.cpus >= 1
        if backend == "docker":  # the container's own cgroup: the template's memory (and its tmpfs) and CPUs
            assert first.source == "cgroup"
            assert first.memory_limit is not None
            assert first.memory_limit >= 256 * MIB
            assert first.cpu_limit == 1.0
        idle = _wait_sample(client, sandbox["id"], "an idle CPU figure", lambda s: s.cpu_percent is not None)
        assert idle.cpu_percent is not None
        start_process(client, sandbox["id"], BUSY)
        # A busy loop takes a whole CPU when it can; on a machine loaded by other work (CI's
        # workers), a share of one: well above the idle sandbox's either way.
        rising = idle.cpu_percent + 15
        busy = _wait_sample(client, sandbox["id"], f"CPU past {rising}%", lambda s: (s.cpu_percent or 0) >= rising)
        assert busy.cpu_percent is not None
        assert busy.cpu_percent <= 100 * (busy.cpus or 1) + 5
        before = _wait_sample(client, sandbox["id"], "a memory figure", lambda s: s.memory_used is not None)
        assert before.memory_used is not None
        start_process(client, sandbox["id"], HOLD_50_MIB)
        _wait_sample(
            client,
            sandbox["id"],
            "50 MiB more memory used",
            lambda s: s.memory_used is not None and s.memory_used >= before.memory_used + 45 * MIB,
        )
        history = _metrics(client, sandbox["id"]).samples
        assert len(history) >= 3
        assert [s.timestamp for s in history] == sorted(s.timestamp for s in history)
        client.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_the_client_the_cli_and_prometheus_answer_the_samples(
    service: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = service.registry.backends["default"].template.backend
    with SandboxClient(service.url, KEYS["alice"]) as client, client.create() as sandbox:
        assert sandbox.execute("true").exit_code == 0
        wait_for(lambda: sandbox.metrics().latest is not None, "a first sample through the client", limit=30)
        assert client.metrics(sandbox.id).sandbox_id == sandbox.id

        async def both() -> tuple[api.SandboxMetrics, api.SandboxMetrics]:
            async with AsyncSandboxClient(service.url, KEYS["alice"]) as aclient:
                return await aclient.metrics(sandbox.id), await aclient.attach(sandbox.id).ametrics()

        for answer in asyncio.run(both()):
            assert answer.latest is not None
            assert answer.interval == 0.2
        assert cli_main(["metrics", sandbox.id, "--url", service.url, "--api-key", KEYS["alice"]]) == 0
        line = capsys.readouterr().out
        assert re.match(rf"{sandbox.id}  cpu \S+  memory \S+  disk \S+  at ", line), line
        with service.client() as http:
            scraped = http.get("/metrics").text
        assert f'sandboxes_usage_memory_bytes{{backend="{backend}"}}' in scraped
        assert "sandboxes_sandbox_" not in scraped  # per sandbox only when an operator asks


def test_another_tenant_sees_no_metrics(service: Running) -> None:
    with service.client() as alice, service.client("bob") as bob:
        sandbox = create(alice)
        assert bob.get(f"/v1/sandboxes/{sandbox['id']}/metrics").status_code == 404
        assert alice.get(f"/v1/sandboxes/{sandbox['id']}/metrics").status_code == 200
        alice.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_no_helper_is_started_to_sample(service: Running) -> None:
    """A sandbox nobody ran anything in keeps no helper and no samples, round after round."""
    sampler = service.app.state.usage
    with service.client() as client:
        sandbox = create(client)
        held = service.registry.entries[sandbox["id"]].sandbox
        rounds = sampler.ticks
        wait_for(lambda: sampler.ticks >= rounds + 3, "three sampling rounds")
        assert held.running_helper() is None
        assert _metrics(client, sandbox["id"]).samples == []
        client.delete(f"/v1/sandboxes/{sandbox['id']}")
