"""The service's warm pool over real Docker (`sandboxes.server.pool`): a create of a template
with ``pool_size`` claims a started, tenant-less sandbox that is then the tenant's alone, the
pool refills, concurrent creates claim distinct ones, ``Idempotency-Key`` replays find the
claimed one, per-create options go cold, and a ``kill -9`` of the service adopts the claimed
ones and makes the pool again without leaking a container."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import (
    SHELL_STARTED_AS,
    UNTHROTTLED,
    Running,
    ServiceProcess,
    create,
    execute,
    running,
    settings_for,
    subprocess_config,
)
from support import SESSION_OWNER

from sandboxes.docker import DockerTemplate
from sandboxes.local import LocalTemplate
from sandboxes.server import pool
from sandboxes.server.backends import LABEL_TENANT, make_backends
from sandboxes.server.metrics import Metrics
from sandboxes.server.pool import Pools

CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}
POOL_LABEL = "io.sandboxes.service-pool"
KEY_LABEL = "io.sandboxes.idempotency-key"


def _wait(what: str, condition: Callable[[], bool], timeout: float = 90) -> None:
    """Until ``condition()`` holds, polled; fails naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.05)


def _members(docker_client: Any, owner: str) -> set[str]:
    """The service ids of the owner's running, tenant-less pooled containers."""
    containers = docker_client.containers.list(filters={"label": [f"io.sandboxes.owner={owner}", POOL_LABEL]})
    return {c.labels["io.sandboxes.service-id"] for c in containers if "io.sandboxes.tenant" not in c.labels}


@pytest.fixture(scope="module")
def service(docker_client: Any, runtime_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    owner = f"{SESSION_OWNER}-pool-{uuid.uuid4().hex[:6]}"
    template = {"backend": "docker", "image": runtime_image, "cpus": 0.5, "memory": "256m", "labels": CLEANUP}
    templates = {"default": DockerTemplate(**template), "pooled": DockerTemplate(**template, pool_size=2)}
    settings = settings_for(tmp_path_factory.mktemp("pool"), owner=owner, templates=templates, tenants=UNTHROTTLED)
    with running(settings, docker_client=docker_client) as svc:
        yield svc
        claimed = svc.registry.pools.claims.ids()  # a test that failed left its tenant's
    left = docker_client.containers.list(all=True, filters={"label": [f"io.sandboxes.owner={owner}", POOL_LABEL]})
    for container in left:
        container.remove(force=True, v=True)
    assert {c.labels["io.sandboxes.service-id"] for c in left} <= claimed  # the shutdown destroyed the pool


def _owner(service: Running) -> str:
    return str(service.app.state.service.settings.owner)


def _full(service: Running) -> set[str]:
    """The pool's members once it holds its two, helpers up."""
    pools = service.registry.pools
    _wait("the pool holds 2 ready sandboxes", lambda: pools.ready("pooled") == 2)
    return {member.state.id for member in pools._ready["pooled"]}


def test_a_create_claims_a_pooled_sandbox_that_is_the_tenants_and_the_pool_refills(
    service: Running, docker_client: Any
) -> None:
    members = _full(service)
    assert _members(docker_client, _owner(service)) == members  # tenant-less containers, labelled so
    with service.client("alice") as alice, service.client("bob") as bob:
        for member in members:  # nobody's yet: no tenant finds, lists or deletes one
            assert alice.get(f"/v1/sandboxes/{member}").status_code == 404
            assert bob.delete(f"/v1/sandboxes/{member}").status_code == 404
        assert not members & {s["id"] for s in alice.get("/v1/sandboxes").json()["sandboxes"]}
        claimed = create(alice, template="pooled", ttl=120)
        assert claimed["id"] in members
        assert (claimed["template"], claimed["backend"]) == ("pooled", "docker")
        # Its first command runs at once in a shell its helper started ahead, marked by the service.
        first = execute(alice, claimed["id"], f"id -u; pwd; echo $SANDBOXES_EXEC_ID; {SHELL_STARTED_AS}")
        uid, workdir, marker, shell = first["output"].splitlines()
        assert (uid, workdir, len(marker), shell) == ("1000", "/workspace", 32, "/bin/sh -s")
        assert claimed["id"] in {s["id"] for s in alice.get("/v1/sandboxes").json()["sandboxes"]}
        assert bob.get(f"/v1/sandboxes/{claimed['id']}").status_code == 404
        assert claimed["id"] not in {s["id"] for s in bob.get("/v1/sandboxes").json()["sandboxes"]}
        refilled = _full(service)
        assert claimed["id"] not in refilled
        assert len(refilled - members) == 1
        assert 'sandboxes_pool_ready{template="pooled"} 2.0' in alice.get("/metrics").text
        # Its claim's expiry is moved onto the container (what the backend's own sweeps go by).
        _wait("the claimed container records its claim's expiry", lambda: _renamed(docker_client, claimed))
        assert alice.delete(f"/v1/sandboxes/{claimed['id']}").status_code == 204
        assert claimed["id"] not in service.registry.pools.claims.ids()


def _renamed(docker_client: Any, sandbox: dict[str, Any]) -> bool:
    """Whether the sandbox's container records the expiry the service answered (its name's)."""
    [container] = docker_client.containers.list(filters={"label": f"io.sandboxes.service-id={sandbox['id']}"})
    return str(container.name).endswith(f".expires-{int(sandbox['expires_at'])}")


def test_concurrent_creates_claim_distinct_sandboxes_and_quotas_count_only_claimed_ones(service: Running) -> None:
    members = _full(service)
    answers: list[httpx.Response] = []
    barrier = threading.Barrier(2)

    def one() -> None:
        with service.client("alice") as alice:
            barrier.wait()
            answers.append(alice.post("/v1/sandboxes", json={"template": "pooled"}))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [a.status_code for a in answers] == [201, 201], [a.text for a in answers]
    ids = {a.json()["id"] for a in answers}
    assert ids == members  # both claimed, each once
    with service.client("alice") as alice:
        for sandbox_id in ids:
            assert execute(alice, sandbox_id, "echo $((6 * 7))")["output"] == "42\n"
            assert alice.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204
    _full(service)  # two pooled sandboxes exist, and the tenant of a one-sandbox quota may still make one
    with service.client("tiny") as tiny:
        mine = create(tiny, template="pooled")
        refused = tiny.post("/v1/sandboxes", json={"template": "pooled"})
        assert refused.status_code == 429, refused.text
        assert tiny.delete(f"/v1/sandboxes/{mine['id']}").status_code == 204


def _tenant_lists(service: Running, monkeypatch: pytest.MonkeyPatch, tenant: str) -> list[str]:
    """The templates whose provider lists the tenant's sandboxes from now on, one per list (the
    quota's reads; a sweep lists every tenant's at once and is not counted)."""
    listed: list[str] = []
    for name, backend in service.registry.backends.items():

        def counted(labels: Mapping[str, str], _name: str = name, _select: Any = backend.provider.select) -> Any:
            if labels.get(LABEL_TENANT) == tenant:
                listed.append(_name)
            return _select(labels)

        monkeypatch.setattr(backend.provider, "select", counted)
    return listed


def test_a_claim_lists_no_backend_and_one_engine_is_listed_once(
    service: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    members = _full(service)
    listed = _tenant_lists(service, monkeypatch, "tiny")
    with service.client("tiny") as tiny:
        mine = create(tiny, template="pooled")
        assert mine["id"] in members
        assert listed == []  # counted from what the service holds: no read of the engine
        _full(service)
        refused = tiny.post("/v1/sandboxes", json={"template": "pooled"})  # a member ready, the quota full
        assert refused.status_code == 429, refused.text
        # Refused by the engine's records, listed once for its two templates.
        assert len(listed) == 1, listed
        assert tiny.delete(f"/v1/sandboxes/{mine['id']}").status_code == 204
        listed.clear()
        cold = create(tiny, template="default")  # counted before creating and again after: one list each
        assert len(listed) == 2, listed
        assert tiny.delete(f"/v1/sandboxes/{cold['id']}").status_code == 204


def test_a_claims_refill_waits_for_its_first_command(
    service: Running, docker_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _full(service)
    monkeypatch.setattr(pool, "REFILL_DELAY", 3.0)
    monkeypatch.setattr(pool, "REFILL_MAX_DELAY", 30.0)
    pools = service.registry.pools
    with service.client("alice") as alice:
        claimed = create(alice, template="pooled", ttl=120)
        assert execute(alice, claimed["id"], "echo first")["output"] == "first\n"
        # Nothing contends with the claim and its first command: the refill starts later.
        assert (pools.ready("pooled"), pools._making["pooled"]) == (1, 0)
        # A renewal meanwhile is what the container records then, not the claim's first expiry.
        renewed = alice.post(f"/v1/sandboxes/{claimed['id']}/renew", json={"ttl": 600})
        assert renewed.status_code == 200, renewed.text
        _full(service)
        _wait("the claimed container records its renewed expiry", lambda: _renamed(docker_client, renewed.json()))
        assert not _renamed(docker_client, claimed)
        assert alice.delete(f"/v1/sandboxes/{claimed['id']}").status_code == 204


def _refilling(pools: Pools) -> bool:
    """Whether the pool's members ready and being made are its size again."""
    return pools._making["pooled"] + pools.ready("pooled") == 2


def test_a_burst_of_claims_is_refilled_once_the_claims_pause(service: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    _full(service)
    monkeypatch.setattr(pool, "REFILL_DELAY", 5.0)
    monkeypatch.setattr(pool, "REFILL_MAX_DELAY", 60.0)
    pools = service.registry.pools
    with service.client("alice") as alice:
        first = create(alice, template="pooled")
        claimed_by = time.monotonic()
        _wait("4 s after the first claim", lambda: time.monotonic() - claimed_by >= 4.0)
        second = create(alice, template="pooled")  # its claim, 4 s on, puts the refill 5 s past it
        _wait("7 s after the first claim", lambda: time.monotonic() - claimed_by >= 7.0)
        assert (pools.ready("pooled"), pools._making["pooled"]) == (0, 0)  # not 5 s after the first
        _full(service)
        monkeypatch.setattr(pool, "REFILL_DELAY", 30.0)
        monkeypatch.setattr(pool, "REFILL_MAX_DELAY", 0.5)
        third = create(alice, template="pooled")  # claims that never pause: refilled all the same
        _wait("the refill of a claim while claims go on", lambda: _refilling(pools), timeout=20)
        for made in (first, second, third):
            assert alice.delete(f"/v1/sandboxes/{made['id']}").status_code == 204


def test_an_idempotency_key_replay_answers_the_claimed_sandbox(service: Running) -> None:
    members = _full(service)
    key = {"Idempotency-Key": uuid.uuid4().hex}
    with service.client("alice") as alice:
        first = alice.post("/v1/sandboxes", json={"template": "pooled"}, headers=key)
        assert first.status_code == 201, first.text
        assert first.json()["id"] in members
        replay = alice.post("/v1/sandboxes", json={"template": "pooled"}, headers=key)
        assert replay.status_code == 201, replay.text
        assert (replay.json()["id"], replay.headers.get("Idempotent-Replayed")) == (first.json()["id"], "true")
        other = alice.post("/v1/sandboxes", json={"template": "pooled", "ttl": 99}, headers=key)
        assert other.status_code == 422, other.text
        assert alice.delete(f"/v1/sandboxes/{first.json()['id']}").status_code == 204


def test_a_keyed_claim_reads_no_backend_and_a_keyed_cold_create_does(
    service: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    members = _full(service)
    selected: list[Mapping[str, str]] = []  # the lists by key (a sweep's lists of all are not counted)
    for backend in service.registry.backends.values():

        def counted(labels: Mapping[str, str], _select: Any = backend.provider.select) -> Any:
            if KEY_LABEL in labels:
                selected.append(dict(labels))
            return _select(labels)

        monkeypatch.setattr(backend.provider, "select", counted)
    key = {"Idempotency-Key": uuid.uuid4().hex}
    with service.client("alice") as alice:
        first = alice.post("/v1/sandboxes", json={"template": "pooled"}, headers=key)
        assert first.status_code == 201, first.text
        assert first.json()["id"] in members
        # Its key looked up in what the service holds, as its quota is counted: no list of the engine.
        assert selected == []
        replay = alice.post("/v1/sandboxes", json={"template": "pooled"}, headers=key)
        assert (replay.status_code, replay.json()["id"]) == (201, first.json()["id"]), replay.text
        assert alice.delete(f"/v1/sandboxes/{first.json()['id']}").status_code == 204
        cold = alice.post("/v1/sandboxes", json={"template": "default"}, headers={"Idempotency-Key": uuid.uuid4().hex})
        assert cold.status_code == 201, cold.text
        assert len(selected) == 1, selected  # looked up on the engine: another replica may have made it
        assert alice.delete(f"/v1/sandboxes/{cold.json()['id']}").status_code == 204


@pytest.mark.parametrize(
    "body",
    [{"env": {"GREETING": "hi"}}, {"labels": {"role": "mine"}}, {"auto_resume": True}, {"egress_allow": []}],
    ids=str,
)
def test_per_create_options_go_cold(service: Running, docker_client: Any, body: dict[str, Any]) -> None:
    members = _full(service)
    with service.client("alice") as alice:
        made = create(alice, template="pooled", **body)
        assert made["id"] not in members
        assert service.registry.pools.ready("pooled") == 2  # nothing claimed
        [container] = docker_client.containers.list(filters={"label": f"io.sandboxes.service-id={made['id']}"})
        assert container.labels["io.sandboxes.tenant"] == "alice"
        if "env" in body:
            assert execute(alice, made["id"], 'echo "$GREETING"')["output"] == "hi\n"
        assert alice.delete(f"/v1/sandboxes/{made['id']}").status_code == 204


def _ready(client: httpx.Client) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith('sandboxes_pool_ready{template="default"}'):
            return float(line.split()[-1])
    return 0.0


def test_kill_9_then_restart_adopts_claimed_sandboxes_and_makes_the_pool_again(
    tmp_path: Path, docker_client: Any, runtime_image: str
) -> None:
    owner = f"{SESSION_OWNER}-pool9-{uuid.uuid4().hex[:6]}"
    template = {"backend": "docker", "image": runtime_image, "cpus": 0.5, "memory": "256m", "labels": CLEANUP}
    config = subprocess_config(tmp_path / "data", owner=owner, templates={"default": {**template, "pool_size": 2}})
    service = ServiceProcess(config, tmp_path)
    key = {"Idempotency-Key": uuid.uuid4().hex}

    def everything() -> set[str]:
        containers = docker_client.containers.list(all=True, filters={"label": f"io.sandboxes.owner={owner}"})
        return {c.labels["io.sandboxes.service-id"] for c in containers}

    service.start()
    try:
        with service.client("alice") as alice:
            _wait("the pool holds 2", lambda: _ready(alice) == 2)
            before = _members(docker_client, owner)
            claimed = alice.post("/v1/sandboxes", json={"ttl": 300}, headers=key).json()
            assert claimed["id"] in before
            execute(alice, claimed["id"], "echo kept > /workspace/file.txt")
            _wait("the pool refilled", lambda: _ready(alice) == 2)
        left = before - {claimed["id"]}
        service.kill()
        service.start()
        with service.client("alice") as alice, service.client("bob") as bob:
            assert [s["id"] for s in alice.get("/v1/sandboxes").json()["sandboxes"]] == [claimed["id"]]
            assert not bob.get("/v1/sandboxes").json()["sandboxes"]
            assert execute(alice, claimed["id"], "cat /workspace/file.txt")["output"] == "kept\n"
            replay = alice.post("/v1/sandboxes", json={"ttl": 300}, headers=key)
            assert (replay.json()["id"], replay.headers.get("Idempotent-Replayed")) == (claimed["id"], "true")
            _wait("the pool was made again", lambda: _ready(alice) == 2)
            pool = _members(docker_client, owner)
            assert not pool & left  # what was unclaimed at the kill was destroyed, not leaked
            assert everything() == {claimed["id"], *pool}
        service.stop()  # a shutdown destroys the pool; the tenant's sandbox stays
        assert everything() == {claimed["id"]}
        assert [path.stem for path in (tmp_path / "data" / "claims").glob("*.json")] == [claimed["id"]]
    finally:
        service.stop()
        for container in docker_client.containers.list(all=True, filters={"label": f"io.sandboxes.owner={owner}"}):
            container.remove(force=True)


def test_a_pool_on_a_backend_that_cannot_record_claims_is_refused(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, templates={"default": LocalTemplate(pool_size=1)})
    with pytest.raises(ValueError, match="template 'default': pool_size needs a backend"):
        Pools(settings, make_backends(settings), Metrics(), time.time)
