"""What a create costs on its way, through the service on a real Docker engine: a burst of
creates shares its quota counts' reads of the engine, sandbox ids are drawn without a read of
the random source each, and the API's models are built at start."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from service_harness import Running, running, settings_for
from support import SESSION_OWNER

from sandboxes.docker import DockerTemplate
from sandboxes.server import backends as server_backends
from sandboxes.server.settings import TenantPolicy

BURST = 6
URL = "/v1/sandboxes"
SESSION_LABEL = "io.sandboxes.test-session"


@pytest.fixture(scope="module")
def docker_service(
    docker_client: Any, runtime_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    template = DockerTemplate(
        backend="docker", image=runtime_image, cpus=0.5, memory="256m", labels={SESSION_LABEL: SESSION_OWNER}
    )
    settings = settings_for(
        tmp_path_factory.mktemp("create-path"),
        owner=SESSION_OWNER,
        templates={"default": template},
        tenants={"alice": TenantPolicy(max_sandboxes=2 * BURST, max_cpus=BURST, rate=10_000, burst=10_000)},
    )
    with running(settings, docker_client=docker_client) as svc:
        yield svc


def test_a_burst_of_creates_shares_its_quota_reads(docker_service: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each create counts its tenant's sandboxes on the engine twice (before, and again once its
    sandbox is made); creates that ask while a read runs share the next one. The reads are held
    until every create of the burst has asked for its first count: then two reads answer them all."""
    registry = docker_service.registry
    backend = registry.backends["default"]
    asked, everyone_asked, reads = [0], threading.Event(), []
    reserve, select = registry._quotas.reserve, backend.select

    async def counting_reserve(*args: Any) -> Any:
        asked[0] += 1  # on the event loop: no lock needed
        if asked[0] == BURST:
            everyone_asked.set()
        return await reserve(*args)

    def held_select(**labels: str) -> Any:
        if "tenant" in labels:
            reads.append(labels)
            assert everyone_asked.wait(30), "the burst's creates did not all ask for a count"
        return select(**labels)

    monkeypatch.setattr(registry._quotas, "reserve", counting_reserve)
    monkeypatch.setattr(backend, "select", held_select)
    with docker_service.client("alice") as alice, ThreadPoolExecutor(BURST) as pool:
        made = list(pool.map(lambda _: alice.post(URL, json={}), range(BURST)))
        try:
            assert [r.status_code for r in made] == [201] * BURST, [r.text for r in made]
        finally:
            for response in made:
                if response.status_code == 201:
                    alice.delete(f"{URL}/{response.json()['id']}")
    assert len(reads) < 2 * BURST, reads  # one read per count: 2 * BURST


def test_sandbox_ids_are_drawn_from_batches_of_the_random_source(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    urandom = os.urandom

    def counted(size: int) -> bytes:
        reads.append(size)
        return urandom(size)

    monkeypatch.setattr(os, "urandom", counted)
    ids = [server_backends.new_sandbox_id() for _ in range(200)]
    assert len(set(ids)) == 200
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in ids)
    assert len(reads) <= 1, reads  # a batch serves hundreds; uuid4 read the source once per id


def test_the_api_models_are_built_when_the_service_starts(tmp_path: Path) -> None:
    """Not at the first create, on the event loop, where a burst would wait behind it."""
    tests = Path(__file__).resolve().parent
    program = f"""
import sys
sys.path[:0] = [{str(tests)!r}, {str(tests.parent)!r}]
from pathlib import Path
from sandboxes import api, lifecycle
from service_harness import running, settings_for
models = [api.CreateSandbox, api.SandboxInfo, api.ExecuteRequest, api.ExecuteResult, lifecycle.CreateOptions]
assert not any(model.__pydantic_complete__ for model in models), "built before the service started"
with running(settings_for(Path({str(tmp_path)!r}))):
    pass
assert all(model.__pydantic_complete__ for model in models), [m.__name__ for m in models if not m.__pydantic_complete__]
"""
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
