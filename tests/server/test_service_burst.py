"""Over real HTTP: a burst of agents, each creating a sandbox and running its first command at
the same instant, past the tenant's sandbox quota and its command cap. Every admitted sandbox
answers its first command (commands past the cap wait their turn); every refused create is a
429 with a ``Retry-After``; creates run at the same time, not one after the other."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from service_harness import POLICIES, Running, create, error_of, running, settings_for

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


QUEUE_WAIT = 2.0
"""``command_slot_wait`` of `queued`: far shorter than its burst takes to serve."""
WORK = 1.0
"""Seconds each of the burst's first commands runs, holding the only slot."""


@pytest.fixture(scope="module")
def queued(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """A tenant with one command slot and a short wait: a burst of its agents queues longer
    than the wait, behind commands that keep ending."""
    policy = TenantPolicy(max_commands=1, rate=10_000, burst=10_000)
    settings = settings_for(
        tmp_path_factory.mktemp("queued"), tenants={**POLICIES, "alice": policy}, command_slot_wait=QUEUE_WAIT
    )
    with running(settings) as svc:
        yield svc


def test_a_burst_longer_than_the_wait_is_served_while_its_queue_moves(queued: Running) -> None:
    """Five first commands of a second each, one at a time: the last waits twice the wait, but
    a command ended within every wait, so none is refused."""
    agents = 5
    assert (agents - 1) * WORK > 1.5 * QUEUE_WAIT  # the burst outlasts the wait, whatever the order
    with queued.client("alice", limits=httpx.Limits(max_connections=2 * agents)) as alice:
        made = [create(alice) for _ in range(agents)]
        try:
            start = threading.Barrier(agents)

            def first(sandbox: dict[str, Any]) -> httpx.Response:
                start.wait(timeout=30)
                command = f"sleep {WORK}; echo ready"
                return alice.post(f"{URL}/{sandbox['id']}/execute", json={"command": command})

            with ThreadPoolExecutor(agents) as pool:
                answers = list(pool.map(first, made))
            assert [a.status_code for a in answers] == [200] * agents, [a.text for a in answers]
            assert [a.json()["output"] for a in answers] == ["ready\n"] * agents
        finally:
            for sandbox in made:
                alice.delete(f"{URL}/{sandbox['id']}")


def test_a_queue_that_does_not_move_is_refused_after_the_wait(queued: Running) -> None:
    """The only slot held by a command that does not end: the next one waits the wait, then is
    told 429 with a ``Retry-After``."""
    with queued.client("alice") as alice:
        sandbox = create(alice)
        release = f"{sandbox['workdir']}/release"
        try:
            with ThreadPoolExecutor(1) as pool:
                holding = pool.submit(
                    alice.post,
                    f"{URL}/{sandbox['id']}/execute",
                    json={"command": f"while [ ! -e {release} ]; do sleep 0.05; done"},
                )
                deadline = time.monotonic() + 30
                while queued.app.state.service.commands.running("alice") < 1:
                    assert time.monotonic() < deadline, "the holding command never took its slot"
                    time.sleep(0.02)
                started = time.monotonic()
                refused = alice.post(f"{URL}/{sandbox['id']}/execute", json={"command": "true"})
                waited = time.monotonic() - started
                write = {"file_path": release, "content": ""}
                alice.post(f"{URL}/{sandbox['id']}/files/write", json=write).raise_for_status()
                assert holding.result(timeout=30).status_code == 200
            assert (refused.status_code, error_of(refused)) == (429, "rate_limited")
            assert refused.headers["retry-after"] == "1"
            assert QUEUE_WAIT <= waited < 3 * QUEUE_WAIT
        finally:
            alice.delete(f"{URL}/{sandbox['id']}")


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
