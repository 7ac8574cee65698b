"""A shared backend (Docker here) that stops answering while the service runs: what needs its
records answers 503 ``backend_unavailable``, as any backend failure does, and the sweep goes on
expiring the sandboxes of the templates that do answer. The engine is a socket nobody listens on
(the real client, a real refusal)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest
from service_harness import ManualClock, Running, create, error_of, running, settings_for

from sandboxes.docker import DockerTemplate
from sandboxes.local import LocalTemplate


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def service(tmp_path: Path, clock: ManualClock) -> Iterator[Running]:
    templates = {"local": LocalTemplate(backend="local"), "docker": DockerTemplate(backend="docker")}
    settings = settings_for(
        tmp_path / "data",
        templates=templates,
        sweep_interval=3600,
    )
    engine = docker.DockerClient(base_url=f"unix://{tmp_path}/no-engine.sock", version="1.41")
    with running(settings, docker_client=engine, clock=clock) as started:
        yield started


@pytest.fixture
def client(service: Running) -> Iterator[httpx.Client]:
    with service.client("alice") as alice:
        yield alice


def test_requests_that_need_the_records_answer_503(client: httpx.Client) -> None:
    answers = {
        "get": client.get("/v1/sandboxes/0123456789abcdef"),
        "list": client.get("/v1/sandboxes"),
        "create": client.post("/v1/sandboxes", json={"template": "local"}),  # quotas count the records
    }
    assert {what: (r.status_code, error_of(r)) for what, r in answers.items()} == dict.fromkeys(
        answers, (503, "backend_unavailable")
    ), {what: r.text for what, r in answers.items()}


def test_the_sweep_expires_the_other_templates_sandboxes(service: Running, clock: ManualClock) -> None:
    registry = service.registry
    assert registry.settings.templates["local"]
    with service.client("alice") as client:
        registry.backends["docker"].select = lambda **labels: []  # answers long enough to create
        try:
            sandbox = create(client, template="local", ttl=60)
        finally:
            del registry.backends["docker"].select
    clock.advance(120)
    service.sweep()
    assert sandbox["id"] not in registry._entries
