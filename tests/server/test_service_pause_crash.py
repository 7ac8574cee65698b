"""A pause across a ``kill -9`` of the service between the freeze and the state file that
records the pause (a real service process, Docker and the local jail). The service is made to
crash at that instant by its test hook `sandboxes.server.pausing.crash_point`: the environment
variable `CRASH_AT` set to ``frozen`` makes it SIGKILL itself right after the freeze, a real
crash at a named point (no request can aim at that window). The restarted service must read the
sandbox back paused as the pause asked (its intent was written before the freeze), never as
running, nor as a pause whose expiry removes it sooner than asked."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import ServiceProcess, create, execute, subprocess_config
from support import SESSION_OWNER

from sandboxes.server.pausing import CRASH_AT

CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}
TEMPLATE_TTL = 3600
"""The templates' TTL, which a resume gives a sandbox paused at its timeout."""
CRASH = {CRASH_AT: "frozen"}


def _service(tmp_path: Path, runtime_image: str, backend: str) -> tuple[ServiceProcess, str]:
    owner = f"{SESSION_OWNER}-pausek9-{uuid.uuid4().hex[:6]}"
    template: dict[str, Any] = {"backend": "local", "default_timeout": 30, "ttl": TEMPLATE_TTL}
    if backend == "docker":
        template = {"backend": "docker", "image": runtime_image, "cpus": 0.5, "memory": "256m", "labels": CLEANUP}
        template["ttl"] = TEMPLATE_TTL
    config = subprocess_config(tmp_path / "data", owner=owner, templates={"default": template})
    return ServiceProcess(config, tmp_path), owner


def _crashed(service: ServiceProcess) -> None:
    """The service ended by its own SIGKILL at the crash point (waited for: its exit is the event)."""
    assert service.process is not None
    assert service.process.wait(120) == -9, service.log_path.read_text()[-3000:]


def _container_status(docker_client: Any, owner: str) -> list[str]:
    filters = {"label": f"io.sandboxes.owner={owner}"}
    return [container.status for container in docker_client.containers.list(all=True, filters=filters)]


def _remove_all(docker_client: Any, owner: str) -> None:
    for container in docker_client.containers.list(all=True, filters={"label": f"io.sandboxes.owner={owner}"}):
        container.remove(force=True, v=True)


@pytest.mark.parametrize("backend", ["docker", "local"])
def test_a_kill_9_right_after_the_freeze_of_a_pause_with_its_clock_stopped_leaves_it_paused_so(
    tmp_path: Path, docker_client: Any, runtime_image: str, backend: str
) -> None:
    """Paused with ``ttl: stop`` and killed right after the freeze: after the restart it reads
    paused (on Docker with its processes kept, its record guarded past its old expiry, as a pause
    that completed has it), and a resume gives back the seconds it had left, with its files."""
    service, owner = _service(tmp_path, runtime_image, backend)
    service.start(env=CRASH)
    try:
        with service.client("alice") as alice:
            created = create(alice, ttl=600)
            sid = created["id"]
            assert execute(alice, sid, "echo kept > note")["exit_code"] == 0
            with pytest.raises(httpx.HTTPError):  # the service dies under the request
                alice.post(f"/v1/sandboxes/{sid}/pause", json={"ttl": "stop"})
        _crashed(service)
        if backend == "docker":
            assert _container_status(docker_client, owner) == ["paused"]  # the freeze happened
        service.start()
        with service.client("alice") as alice:
            shown = alice.get(f"/v1/sandboxes/{sid}").json()
            assert (shown["state"], shown["processes_kept"]) == ("paused", backend == "docker"), shown
            if backend == "docker":  # no replica's sweep removes it at its old expiry
                assert shown["expires_at"] > created["expires_at"] + TEMPLATE_TTL, shown
            resumed = alice.post(f"/v1/sandboxes/{sid}/resume").json()
            assert resumed["state"] == "running", resumed
            assert 0 < resumed["expires_at"] - time.time() <= 601  # the seconds it had left, in whole seconds on Docker
            assert execute(alice, sid, "cat note")["output"] == "kept\n"
            assert alice.delete(f"/v1/sandboxes/{sid}").status_code == 204
    finally:
        service.stop()
        _remove_all(docker_client, owner)


@pytest.mark.parametrize("backend", ["docker", "local"])
def test_a_kill_9_right_after_the_freeze_at_its_timeout_leaves_it_paused_at_its_timeout(
    tmp_path: Path, docker_client: Any, runtime_image: str, backend: str
) -> None:
    """Created to freeze at the end of its TTL, and the service killed right after that freeze:
    after the restart it reads paused (not running, not removed as expired), and a resume gives
    its template's TTL, as a pause at its timeout does, with its files."""
    service, owner = _service(tmp_path, runtime_image, backend)
    service.start(env=CRASH)
    try:
        with service.client("alice") as alice:
            sid = create(alice, ttl=10, on_timeout="freeze")["id"]
            assert execute(alice, sid, "echo kept > note")["exit_code"] == 0
        _crashed(service)  # its timer fired at the end of its TTL, and froze it
        if backend == "docker":
            assert _container_status(docker_client, owner) == ["paused"]
        service.start()
        with service.client("alice") as alice:
            shown = alice.get(f"/v1/sandboxes/{sid}")
            assert shown.status_code == 200, shown.text
            assert (shown.json()["state"], shown.json()["processes_kept"]) == ("paused", backend == "docker")
            resumed = alice.post(f"/v1/sandboxes/{sid}/resume").json()
            assert resumed["state"] == "running", resumed
            assert resumed["expires_at"] - time.time() == pytest.approx(TEMPLATE_TTL, abs=60)
            assert execute(alice, sid, "cat note")["output"] == "kept\n"
            assert alice.delete(f"/v1/sandboxes/{sid}").status_code == 204
    finally:
        service.stop()
        _remove_all(docker_client, owner)


def test_a_kill_9_between_the_intent_and_the_freeze_of_a_pause_leaves_it_running(
    tmp_path: Path, docker_client: Any, runtime_image: str
) -> None:
    """Killed after the pause's intent was written but before the freeze (crash point
    ``intended``): the restart finds its container running and undoes the intent, so it reads
    running with the expiry it had, and runs commands."""
    service, owner = _service(tmp_path, runtime_image, "docker")
    service.start(env={CRASH_AT: "intended"})
    try:
        with service.client("alice") as alice:
            created = create(alice, ttl=600)
            sid = created["id"]
            with pytest.raises(httpx.HTTPError):
                alice.post(f"/v1/sandboxes/{sid}/pause", json={"ttl": "stop"})
        _crashed(service)
        assert _container_status(docker_client, owner) == ["running"]
        service.start()
        with service.client("alice") as alice:
            shown = alice.get(f"/v1/sandboxes/{sid}").json()
            assert (shown["state"], shown["expires_at"]) == ("running", created["expires_at"]), shown
            assert execute(alice, sid, "echo on")["output"] == "on\n"
            assert not (tmp_path / "data" / "state" / f"{sid}.json").exists()  # running: its labels say it all
            assert alice.delete(f"/v1/sandboxes/{sid}").status_code == 204
    finally:
        service.stop()
        _remove_all(docker_client, owner)


def test_a_kill_9_between_the_intent_and_the_freeze_at_its_timeout_pauses_it_after_the_restart(
    tmp_path: Path, docker_client: Any, runtime_image: str
) -> None:
    """Killed after the intent of its pause at its timeout was written but before the freeze:
    its TTL is over, so the restarted service makes that pause (it is not left running, nor
    removed), and a resume gives its template's TTL."""
    service, owner = _service(tmp_path, runtime_image, "docker")
    service.start(env={CRASH_AT: "intended"})
    try:
        with service.client("alice") as alice:
            sid = create(alice, ttl=10, on_timeout="freeze")["id"]
        _crashed(service)
        assert _container_status(docker_client, owner) == ["running"]
        service.start()
        with service.client("alice") as alice:
            deadline = time.monotonic() + 60
            while (shown := alice.get(f"/v1/sandboxes/{sid}").json())["state"] != "paused":
                assert time.monotonic() < deadline, shown
                time.sleep(0.02)
            assert shown["processes_kept"] is True
            assert _container_status(docker_client, owner) == ["paused"]
            resumed = alice.post(f"/v1/sandboxes/{sid}/resume").json()
            assert resumed["expires_at"] - time.time() == pytest.approx(TEMPLATE_TTL, abs=60)
            assert alice.delete(f"/v1/sandboxes/{sid}").status_code == 204
    finally:
        service.stop()
        _remove_all(docker_client, owner)
