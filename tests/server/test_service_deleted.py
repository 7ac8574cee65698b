"""A deletion answered 204 whose destroy failed stays a deletion across a restart of the service.

The backend refuses the removal (the Docker engine's 500 "unable to remove filesystem", injected
at the engine call: the client's container removal raises it; the local provider's removal raises
an `OSError`): the service answers 204 and its sweep retries the destroy from its memory. The
service then stops (as by SIGTERM: the in-process tests) or is killed (``kill -9``: a real service
process whose removals all fail, `removal_refused`) before a retry succeeds. The next start must
not bring the sandbox back (listed, found, running commands, counted against the quota) but finish
its removal, on its own or claimed from a warm pool. Tenant ``tiny`` has a quota of one sandbox."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import docker.models.containers
import httpx
import pytest
import removal_refused
from removal_refused import refused_local_removal, refused_removal
from service_harness import (
    ManualClock,
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
from sandboxes.local.provider import LocalProvider
from sandboxes.server.holdings import DELETED_GRACE

CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}
REFUSING = (removal_refused.__file__,)
"""The service's program with every removal refused (`removal_refused`)."""


@pytest.fixture
def owner() -> str:
    return f"{SESSION_OWNER}-deleted-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def templates(runtime_image: str) -> dict[str, Any]:
    docker_template = {"backend": "docker", "image": runtime_image, "cpus": 0.5, "memory": "256m", "labels": CLEANUP}
    return {"default": docker_template, "pooled": {**docker_template, "pool_size": 1}, "local": {"backend": "local"}}


@pytest.fixture
def engine(docker_client: Any, owner: str) -> Iterator[Any]:
    """The engine, and everything of ``owner`` removed from it after the test."""
    yield docker_client
    for container in docker_client.containers.list(all=True, filters={"label": f"io.sandboxes.owner={owner}"}):
        container.remove(force=True, v=True)


def _on_engine(docker_client: Any, owner: str) -> dict[str, str]:
    """Service id -> status of the owner's containers (a pooled one's labels name no tenant)."""
    containers = docker_client.containers.list(all=True, filters={"label": f"io.sandboxes.owner={owner}"})
    return {c.labels["io.sandboxes.service-id"]: c.status for c in containers}


def _kinds(templates: dict[str, Any]) -> dict[str, Any]:
    return {
        name: LocalTemplate(**t) if t["backend"] == "local" else DockerTemplate(**t) for name, t in templates.items()
    }


def _assert_gone_for_good(tiny: httpx.Client, sandbox_id: str, template: str) -> None:
    """Neither listed, nor found, nor running commands, nor counted against the quota."""
    listed = tiny.get("/v1/sandboxes")
    assert listed.status_code == 200, listed.text
    assert [s["id"] for s in listed.json()["sandboxes"]] == []
    assert tiny.get(f"/v1/sandboxes/{sandbox_id}").status_code == 404
    assert tiny.post(f"/v1/sandboxes/{sandbox_id}/execute", json={"command": "true"}).status_code == 404
    another = create(tiny, template=template, ttl=60)  # its share of the quota of one is free
    assert tiny.delete(f"/v1/sandboxes/{another['id']}").status_code == 204


@pytest.mark.parametrize("template", ["default", "pooled"])
def test_a_stop_while_the_destroy_fails_on_docker_does_not_bring_the_sandbox_back(
    tmp_path: Path, engine: Any, owner: str, templates: dict[str, Any], template: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deletion is recorded on the container itself before it is answered: the restart
    reads it there (or in the claim of a pooled one) and removes the container."""
    settings = settings_for(tmp_path / "data", owner=owner, templates=_kinds(templates))
    with (
        monkeypatch.context() as refused,
        running(settings, docker_client=engine) as service,
        service.client("tiny") as tiny,
    ):
        if template == "pooled":
            _wait_pool_ready(tiny)
        sandbox = create(tiny, template=template, ttl=300)
        if template == "pooled":
            assert sandbox["id"] in service.registry.pools.claims.ids()  # claimed, not made cold
        refused.setattr(docker.models.containers.Container, "remove", refused_removal)
        assert tiny.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
        assert sandbox["id"] in _on_engine(engine, owner)  # its destroy failed
    # Stopped before any retry could succeed; the engine removes again from here on.
    with running(settings, docker_client=engine) as service, service.client("tiny") as tiny:
        _assert_gone_for_good(tiny, sandbox["id"], template)
        assert sandbox["id"] not in _on_engine(engine, owner)  # the start finished the removal


def test_a_stop_while_the_destroy_fails_on_the_local_backend_does_not_bring_the_sandbox_back(
    tmp_path: Path, owner: str, templates: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local backend's deletion is its state file's tombstone, written before the destroy."""
    settings = settings_for(tmp_path / "data", owner=owner, templates=_kinds({"local": templates["local"]}))
    with monkeypatch.context() as refused, running(settings) as service, service.client("tiny") as tiny:
        sandbox = create(tiny, template="local", ttl=300)
        refused.setattr(LocalProvider, "destroy", refused_local_removal)
        assert tiny.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
        assert Path(sandbox["workdir"]).exists()  # its destroy failed
    # Stopped before any retry could succeed; the provider removes again from here on.
    with running(settings) as service, service.client("tiny") as tiny:
        _assert_gone_for_good(tiny, sandbox["id"], "local")
        assert not Path(sandbox["workdir"]).exists()  # the start finished the removal


@pytest.mark.parametrize("template", ["default", "pooled", "local"])
def test_a_kill_9_while_the_destroy_fails_does_not_bring_the_sandbox_back(
    tmp_path: Path, engine: Any, owner: str, templates: dict[str, Any], template: str
) -> None:
    """A real service process whose every removal fails (`removal_refused`), killed by SIGKILL
    while its sweep retries the destroy; the service started again (removals working) finishes it."""
    config = subprocess_config(tmp_path / "data", owner=owner, templates=templates)
    service = ServiceProcess(config, tmp_path)
    service.start(program=REFUSING)
    try:
        with service.client("tiny") as tiny:
            if template == "pooled":
                _wait_pool_ready(tiny)
            sandbox = create(tiny, template=template, ttl=300)
            assert tiny.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
            if template == "local":
                assert Path(sandbox["workdir"]).exists()
            else:
                assert sandbox["id"] in _on_engine(engine, owner)
        service.kill()
        service.start()
        with service.client("tiny") as tiny:
            _assert_gone_for_good(tiny, sandbox["id"], template)
            if template == "local":
                assert not Path(sandbox["workdir"]).exists()
            else:
                assert sandbox["id"] not in _on_engine(engine, owner)
    finally:
        service.stop()


def _refused_rename(self: Any, name: str) -> None:
    raise docker.errors.APIError("500 Server Error: Internal Server Error", explanation="the engine failed (injected)")


def _wait_pool_ready(client: httpx.Client) -> None:
    """Until the pooled template's pool holds its one member (its gauge says so)."""
    deadline = time.monotonic() + 90
    while 'sandboxes_pool_ready{template="pooled"} 1.0' not in client.get("/metrics").text:
        assert time.monotonic() < deadline, "the pool never filled"
        time.sleep(0.05)


def test_a_deletion_the_engine_cannot_record_is_refused_and_undone_nowhere(
    tmp_path: Path, engine: Any, owner: str, templates: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine refuses to record the deletion (the container's rename): nothing was done, and
    the answer says so (503, to retry), rather than a 204 that a restart could undo."""
    settings = settings_for(tmp_path / "data", owner=owner, templates=_kinds({"default": templates["default"]}))
    with running(settings, docker_client=engine) as service, service.client("tiny") as tiny:
        sandbox = create(tiny, ttl=300)
        with monkeypatch.context() as refused:
            refused.setattr(docker.models.containers.Container, "rename", _refused_rename)
            answer = tiny.delete(f"/v1/sandboxes/{sandbox['id']}")
        assert (answer.status_code, answer.json()["error"]) == (503, "backend_unavailable"), answer.text
        assert tiny.get(f"/v1/sandboxes/{sandbox['id']}").json() == sandbox
        assert execute(tiny, sandbox["id"], "echo here")["output"] == "here\n"
        assert tiny.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
        assert sandbox["id"] not in _on_engine(engine, owner)


def test_a_read_while_the_deletion_is_marked_leaves_the_destroy_to_the_deleter(
    tmp_path: Path, engine: Any, owner: str, templates: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another request reads the sandbox's record between its deletion's mark and its destroy (a
    GET of it, re-read at once: ``confirm_interval`` 0): it finds it gone, and the deleter still
    destroys it, so the DELETE's 204 leaves nothing on the engine (the read forgot the held
    sandbox, and the deleter, finding it forgotten, destroyed nothing)."""
    kinds = _kinds({"default": templates["default"]})
    settings = settings_for(tmp_path / "data", owner=owner, templates=kinds, confirm_interval=0)
    with running(settings, docker_client=engine) as service, service.client("tiny") as tiny:
        sandbox = create(tiny, ttl=300)
        backend = service.registry.backends["default"]
        renew, reads = backend.renew, []

        def mark_then_read(state: Any, expires_at: float) -> None:
            renew(state, expires_at)
            if expires_at < time.time():  # the deletion's mark, an expiry long past
                with service.client("tiny") as other:
                    reads.append(other.get(f"/v1/sandboxes/{sandbox['id']}").status_code)

        monkeypatch.setattr(backend, "renew", mark_then_read)
        assert tiny.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
        assert reads == [404]
        assert sandbox["id"] not in _on_engine(engine, owner)


def test_a_claims_expiry_recorded_late_does_not_undo_its_deletion(
    tmp_path: Path, engine: Any, owner: str, templates: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool records a claim's expiry on its container a little after the claim
    (`sandboxes.server.pool`): one that read the claim before the deletion and lands after it
    must not move the claim's expiry back from its deletion's, which the restart reads."""
    settings = settings_for(tmp_path / "data", owner=owner, templates=_kinds({"pooled": templates["pooled"]}))
    pool_renewing, deletion_recorded = threading.Event(), threading.Event()
    with (
        monkeypatch.context() as refused,
        running(settings, docker_client=engine) as service,
        service.client("tiny") as tiny,
    ):
        backend = service.registry.backends["pooled"]
        renew = backend.renew

        def after_the_deletion(state: Any, expires_at: float) -> None:
            if expires_at < time.time():  # the deletion's record: an expiry long past
                renew(state, expires_at)
                deletion_recorded.set()
                return
            pool_renewing.set()
            assert deletion_recorded.wait(60)
            renew(state, expires_at)

        _wait_pool_ready(tiny)
        refused.setattr(backend, "renew", after_the_deletion)
        sandbox = create(tiny, template="pooled", ttl=300)
        assert pool_renewing.wait(60)  # the pool's recording read the claim, and waits
        refused.setattr(docker.models.containers.Container, "remove", refused_removal)
        assert tiny.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
    with running(settings, docker_client=engine) as service, service.client("tiny") as tiny:
        _assert_gone_for_good(tiny, sandbox["id"], "pooled")
        assert sandbox["id"] not in _on_engine(engine, owner)


def test_another_replica_destroys_a_deletion_whose_deleter_is_gone_after_the_grace(
    tmp_path: Path, engine: Any, owner: str, templates: dict[str, Any]
) -> None:
    """Replica A records a deletion whose destroy fails (`removal_refused`) and is killed for good;
    replica B leaves the marked container to its deleter for `DELETED_GRACE` seconds of its clock
    from when it first saw the mark, then its sweep destroys it."""
    kinds = _kinds({"default": templates["default"]})
    clock = ManualClock()
    settings = settings_for(tmp_path / "b", owner=owner, templates=kinds, sweep_interval=3600)
    with running(settings, docker_client=engine, clock=clock) as b:
        only = {"default": templates["default"]}
        a = ServiceProcess(subprocess_config(tmp_path / "a", owner=owner, templates=only), tmp_path)
        a.start(program=REFUSING)
        try:
            with a.client("tiny") as tiny:
                sandbox = create(tiny, ttl=300)
                assert tiny.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
        finally:
            a.kill()
        assert sandbox["id"] in _on_engine(engine, owner)
        b.sweep()  # B sees the mark: the deleter's to destroy, for now
        clock.advance(DELETED_GRACE - 5)
        b.sweep()
        assert sandbox["id"] in _on_engine(engine, owner)
        clock.advance(10)
        b.sweep()
        assert sandbox["id"] not in _on_engine(engine, owner)
