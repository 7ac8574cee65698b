"""Over real HTTP: a burst of agents, each creating a sandbox and running its first command at
the same instant, past the tenant's sandbox quota and its command cap. Every admitted sandbox
answers its first command (commands past the cap wait their turn); every refused create is a
429 with a ``Retry-After``; creates run at the same time, not one after the other."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from service_harness import POLICIES, Running, error_of, running, settings_for

from sandboxes.server.settings import TenantPolicy

URL = "/v1/sandboxes"
AGENTS = 30
ADMITTED = 20
CAP = 4
"""The tenant's commands at once: far fewer than the burst's first commands."""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    policy = TenantPolicy(
        max_sandboxes=ADMITTED, max_cpus=ADMITTED, max_memory="64g", max_commands=CAP, rate=10_000, burst=10_000
    )
    tenants = {**POLICIES, "alice": policy}
    settings = settings_for(tmp_path_factory.mktemp("burst"), tenants=tenants, command_slot_wait=60)
    with running(settings) as svc:
        yield svc


def _agent(client: httpx.Client, start: threading.Barrier, n: int) -> tuple[httpx.Response, httpx.Response | None]:
    """Create a sandbox and run a first command in it, as an agent starting up does."""
    start.wait(timeout=30)
    created = client.post(URL, json={"labels": {"agent": str(n)}})
    if created.status_code != 201:
        return created, None
    return created, client.post(f"{URL}/{created.json()['id']}/execute", json={"command": f"echo ready {n}"})


def test_every_admitted_sandbox_answers_its_first_command(service: Running) -> None:
    with service.client("alice", limits=httpx.Limits(max_connections=2 * AGENTS)) as alice:
        start = threading.Barrier(AGENTS)
        with ThreadPoolExecutor(AGENTS) as pool:
            outcomes = list(pool.map(lambda n: _agent(alice, start, n), range(AGENTS)))
        admitted = [(created, first) for created, first in outcomes if created.status_code == 201]
        try:
            refused = [created for created, first in outcomes if created.status_code != 201]
            assert len(admitted) == ADMITTED
            assert {(r.status_code, error_of(r)) for r in refused} == {(429, "quota_exceeded")}
            assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
            answers = [first for _, first in admitted]
            assert [a.status_code for a in answers if a is not None] == [200] * ADMITTED, [
                a.text for a in answers if a is not None and a.status_code != 200
            ]
            agents = [int(created.json()["labels"]["agent"]) for created, _ in admitted]
            outputs = [(a.json()["exit_code"], a.json()["output"]) for a in answers if a is not None]
            assert outputs == [(0, f"ready {n}\n") for n in agents]
        finally:
            for created, _ in admitted:
                alice.delete(f"{URL}/{created.json()['id']}")


def test_creates_run_at_the_same_time(service: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two creates meet inside the backend's create: neither waits for the other to finish."""
    backend = service.registry.backends["default"]
    inside = threading.Barrier(2, timeout=20)
    create = backend.create

    def meeting(*args: Any, **kwargs: Any) -> Any:
        inside.wait()  # broken (and the create failed) unless the other create is inside too
        return create(*args, **kwargs)

    monkeypatch.setattr(backend, "create", meeting)
    with service.client("bob") as bob, ThreadPoolExecutor(2) as pool:
        made = list(pool.map(lambda _: bob.post(URL, json={}), range(2)))
        try:
            assert [response.status_code for response in made] == [201, 201], [r.text for r in made]
        finally:
            for response in made:
                if response.status_code == 201:
                    bob.delete(f"{URL}/{response.json()['id']}")


def test_a_quota_waiting_cannot_free_is_a_403(service: Running) -> None:
    """``big`` asks for 4 cpus; ``tiny`` may have 1.5, so it can never have one: no Retry-After."""
    with service.client("tiny") as tiny:
        refused = tiny.post(URL, json={"template": "big"})
    assert (refused.status_code, error_of(refused)) == (403, "quota_exceeded")
    assert "retry-after" not in refused.headers
    assert "no sandbox of this template fits" in refused.json()["message"]


def test_a_full_quota_says_when_its_first_sandbox_expires(service: Running) -> None:
    with service.client("tiny") as tiny:
        first = tiny.post(URL, json={"ttl": 300})
        assert first.status_code == 201, first.text
        try:
            refused = tiny.post(URL, json={})
            assert (refused.status_code, error_of(refused)) == (429, "quota_exceeded")
            assert 250 < int(refused.headers["retry-after"]) <= 300
            assert "1 live sandboxes" in refused.json()["message"]
        finally:
            tiny.delete(f"{URL}/{first.json()['id']}")
