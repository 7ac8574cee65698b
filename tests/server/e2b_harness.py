"""The service the E2B tests (and other per-backend service tests) drive: one per module, over
the local jail and over Docker (its containers labelled for cleanup), and the E2B SDK options
that reach it."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from service_harness import CLEANUP, KEYS, ManualClock, Running, running, settings_for
from support import HAS_BWRAP, SESSION_OWNER, needs

from sandboxes.docker import DockerTemplate
from sandboxes.local import LocalTemplate

__all__ = ["CLEANUP", "opts", "service_fixture"]


def service_fixture(
    tag: str,
    backends: tuple[str, ...] = ("local", "docker"),
    *,
    cpus: float = 0.5,
    manual_clock: bool = False,
    **overrides: Any,
) -> Callable[..., Iterator[Running]]:
    """A module-scoped ``service`` fixture, one service per backend in ``backends`` (a local
    jail, Docker's runtime image with ``cpus``), whose sandboxes' owner starts with the test
    session's and ``tag``; ``overrides``: settings beside the template, ``manual_clock``: the
    service's TTLs on a `ManualClock`."""

    @pytest.fixture(scope="module", params=backends)
    def service(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
        if request.param == "local":
            needs(HAS_BWRAP, "bubblewrap is not installed")
            template: Any = LocalTemplate(default_timeout=30)
            docker_client = None
        else:
            docker_client = request.getfixturevalue("docker_client")
            image = request.getfixturevalue("runtime_image")
            template = DockerTemplate(backend="docker", image=image, cpus=cpus, memory="256m", labels=CLEANUP)
        owner = f"{SESSION_OWNER}-{tag}-{uuid.uuid4().hex[:6]}"
        settings = settings_for(tmp_path_factory.mktemp(tag), owner=owner, templates={"default": template}, **overrides)
        clock = ManualClock() if manual_clock else None
        with running(settings, docker_client=docker_client, clock=clock) as svc:
            yield svc

    return service


def opts(service: Running, tenant: str = "alice") -> dict[str, Any]:
    """What ``E2B_API_KEY``, ``E2B_API_URL`` and ``E2B_SANDBOX_URL`` would say."""
    return {"api_key": KEYS[tenant], "api_url": f"{service.url}/e2b", "sandbox_url": f"{service.url}/e2b/envd"}
