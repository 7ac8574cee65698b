"""A pause, and a resume, across a ``kill -9`` of the service between the freeze (or thaw) and
the state file that records it (a real service process, Docker and the local jail). The service
is made to crash at that instant by its test hook `sandboxes.server.pausing.crash_point`: the
environment variable `CRASH_AT` set to ``frozen`` (or ``resumed``) makes it SIGKILL itself right
after the freeze (or thaw), a real crash at a named point (no request can aim at that window).
The restarted service must read the sandbox back paused as the pause asked (its intent was
written before the freeze), never as running, nor as a pause whose expiry removes it sooner than
asked; and a resume that thawed it completed with the TTL it gives back, not its pause's guard."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import ServiceProcess, backend_process, create, execute, owned_containers, started

from sandboxes.docker._containers import recorded_expiry
from sandboxes.server.pausing import CRASH_AT

TEMPLATE_TTL = 3600
"""The templates' TTL, which a resume gives a sandbox paused at its timeout."""
CRASH = {CRASH_AT: "frozen"}


def _service(tmp_path: Path, runtime_image: str, backend: str) -> tuple[ServiceProcess, str]:
    return backend_process(tmp_path, runtime_image, backend, "pausek9", ttl=TEMPLATE_TTL)


def _crashed(service: ServiceProcess) -> None:
    """The service ended by its own SIGKILL at the crash point (waited for: its exit is the event)."""
    assert service.process is not None
    assert service.process.wait(120) == -9, service.log_path.read_text()[-3000:]


def _container_status(docker_client: Any, owner: str) -> list[str]:
    return [container.status for container in owned_containers(docker_client, owner)]


def _left(created: dict[str, Any], paused_before: float) -> float:
    """The most seconds a resume may give back to a sandbox paused with its clock stopped: what
    it had left when its pause was asked (it had less by the pause), plus the whole second its
    new expiry is rounded up to on a shared backend."""
    return float(created["expires_at"]) - paused_before + 1


@pytest.mark.parametrize("backend", ["docker", "local"])
def test_a_kill_9_right_after_the_freeze_of_a_pause_with_its_clock_stopped_leaves_it_paused_so(
    tmp_path: Path, docker_client: Any, runtime_image: str, backend: str
) -> None:
    """Paused with ``ttl: stop`` and killed right after the freeze: after the restart it reads
    paused (on Docker with its processes kept, its record guarded past its old expiry, as a pause
    that completed has it), and a resume gives back the seconds it had left, with its files."""
    service, owner = _service(tmp_path, runtime_image, backend)
    with started(service, owner, docker_client, CRASH):
        with service.client("alice") as alice:
            created = create(alice, ttl=600)
            sid = created["id"]
            assert execute(alice, sid, "echo kept > note")["exit_code"] == 0
            paused_before = time.time()
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
            assert 0 < resumed["expires_at"] - time.time() <= _left(created, paused_before)
            assert execute(alice, sid, "cat note")["output"] == "kept\n"
            assert alice.delete(f"/v1/sandboxes/{sid}").status_code == 204


@pytest.mark.parametrize("backend", ["docker", "local"])
def test_a_kill_9_right_after_the_freeze_at_its_timeout_leaves_it_paused_at_its_timeout(
    tmp_path: Path, docker_client: Any, runtime_image: str, backend: str
) -> None:
    """Created to freeze at the end of its TTL, and the service killed right after that freeze:
    after the restart it reads paused (not running, not removed as expired), and a resume gives
    its template's TTL, as a pause at its timeout does, with its files."""
    service, owner = _service(tmp_path, runtime_image, backend)
    with started(service, owner, docker_client, CRASH):
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


def test_a_kill_9_between_the_intent_and_the_freeze_of_a_pause_leaves_it_running(
    tmp_path: Path, docker_client: Any, runtime_image: str
) -> None:
    """Killed after the pause's intent was written but before the freeze (crash point
    ``intended``): the restart finds its container running and undoes the intent, so it reads
    running with the expiry it had, and runs commands."""
    service, owner = _service(tmp_path, runtime_image, "docker")
    with started(service, owner, docker_client, {CRASH_AT: "intended"}):
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


def test_a_kill_9_between_the_intent_and_the_freeze_at_its_timeout_pauses_it_after_the_restart(
    tmp_path: Path, docker_client: Any, runtime_image: str
) -> None:
    """Killed after the intent of its pause at its timeout was written but before the freeze:
    its TTL is over, so the restarted service makes that pause (it is not left running, nor
    removed), and a resume gives its template's TTL."""
    service, owner = _service(tmp_path, runtime_image, "docker")
    with started(service, owner, docker_client, {CRASH_AT: "intended"}):
        with service.client("alice") as alice:
            sid = create(alice, ttl=10, on_timeout="freeze")["id"]
        _crashed(service)
        assert _container_status(docker_client, owner) == ["running"]
        service.start()
        with service.client("alice") as alice:
            shown = _paused_at_its_timeout(alice, sid)
            assert shown["processes_kept"] is True
            assert _container_status(docker_client, owner) == ["paused"]
            resumed = alice.post(f"/v1/sandboxes/{sid}/resume").json()
            assert resumed["expires_at"] - time.time() == pytest.approx(TEMPLATE_TTL, abs=60)
            assert alice.delete(f"/v1/sandboxes/{sid}").status_code == 204


def _paused_at_its_timeout(alice: httpx.Client, sid: str) -> dict[str, Any]:
    """Waited for until it reads paused at the end of its TTL (the state read is the event): the
    sandbox as it then reads."""
    deadline = time.monotonic() + 60
    while (shown := alice.get(f"/v1/sandboxes/{sid}").json())["state"] != "paused":
        assert time.monotonic() < deadline, shown
        time.sleep(0.02)
    return dict(shown)


def _killed_resuming(service: ServiceProcess, alice: httpx.Client, sid: str) -> None:
    """Its resume asked for, and the service dead under that request at its crash point."""
    with pytest.raises(httpx.HTTPError):
        alice.post(f"/v1/sandboxes/{sid}/resume")
    _crashed(service)


def _stopped_then_killed_resuming(service: ServiceProcess, alice: httpx.Client) -> dict[str, Any]:
    """A sandbox made (600 s of TTL, a file written), paused with ``ttl: stop``, then resumed
    into the service's crash point: as created."""
    created = create(alice, ttl=600)
    sid = created["id"]
    assert execute(alice, sid, "echo kept > note")["exit_code"] == 0
    paused_before = time.time()
    assert alice.post(f"/v1/sandboxes/{sid}/pause", json={"ttl": "stop"}).status_code == 200
    _killed_resuming(service, alice, sid)
    return {**created, "paused_before": paused_before}


@pytest.mark.parametrize("backend", ["docker", "local"])
def test_a_kill_9_right_after_the_thaw_of_a_pause_with_its_clock_stopped_gives_back_its_seconds(
    tmp_path: Path, docker_client: Any, runtime_image: str, backend: str
) -> None:
    """Paused with ``ttl: stop``, then killed right after the thaw of its resume (crash point
    ``resumed``): on Docker the restart finds it running and completes the resume, with the
    seconds it had left (not the pause's guarded expiry, up to ``max_ttl``); a local jail, whose
    processes ended with the service, still reads paused, and a resume gives back those seconds."""
    service, owner = _service(tmp_path, runtime_image, backend)
    with started(service, owner, docker_client, {CRASH_AT: "resumed"}):
        with service.client("alice") as alice:
            created = _stopped_then_killed_resuming(service, alice)
        sid = created["id"]
        if backend == "docker":
            assert _container_status(docker_client, owner) == ["running"]  # the thaw happened
        service.start()
        with service.client("alice") as alice:
            shown = alice.get(f"/v1/sandboxes/{sid}").json()
            if backend == "local":
                assert (shown["state"], shown["processes_kept"]) == ("paused", False), shown
                shown = alice.post(f"/v1/sandboxes/{sid}/resume").json()
            assert shown["state"] == "running", shown
            assert 0 < shown["expires_at"] - time.time() <= _left(created, created["paused_before"]), shown
            assert execute(alice, sid, "cat note")["output"] == "kept\n"
            assert alice.delete(f"/v1/sandboxes/{sid}").status_code == 204


def test_a_kill_9_right_after_the_thaw_of_a_pause_at_its_timeout_gives_its_template_ttl(
    tmp_path: Path, docker_client: Any, runtime_image: str
) -> None:
    """Paused at the end of its TTL, then killed right after the thaw of its resume: the restart
    completes the resume with its template's TTL, its record too (not the ``max_ttl`` its pause
    guarded it for), and it runs commands."""
    service, owner = _service(tmp_path, runtime_image, "docker")
    with started(service, owner, docker_client, {CRASH_AT: "resumed"}):
        with service.client("alice") as alice:
            sid = create(alice, ttl=10, on_timeout="freeze")["id"]
            _paused_at_its_timeout(alice, sid)
            _killed_resuming(service, alice, sid)
        assert _container_status(docker_client, owner) == ["running"]
        service.start()
        with service.client("alice") as alice:
            shown = alice.get(f"/v1/sandboxes/{sid}").json()
            assert shown["state"] == "running", shown
            assert shown["expires_at"] - time.time() == pytest.approx(TEMPLATE_TTL, abs=60), shown
            (container,) = docker_client.containers.list(filters={"label": f"io.sandboxes.owner={owner}"})
            assert recorded_expiry(container.attrs) == shown["expires_at"]  # its record's, for other replicas
            assert execute(alice, sid, "echo on")["output"] == "on\n"
            assert not (tmp_path / "data" / "state" / f"{sid}.json").exists()  # running: its labels say it all
            assert alice.delete(f"/v1/sandboxes/{sid}").status_code == 204


def test_a_kill_9_between_the_intent_and_the_thaw_of_a_resume_leaves_it_paused_as_it_was(
    tmp_path: Path, docker_client: Any, runtime_image: str
) -> None:
    """Killed after the resume's intent was written but before the thaw (crash point
    ``resuming``): the restart finds its container frozen and drops the intent, so it reads
    paused with its clock stopped, still guarded past its old expiry, and a resume then gives
    back the seconds it had left."""
    service, owner = _service(tmp_path, runtime_image, "docker")
    with started(service, owner, docker_client, {CRASH_AT: "resuming"}):
        with service.client("alice") as alice:
            created = _stopped_then_killed_resuming(service, alice)
        sid = created["id"]
        assert _container_status(docker_client, owner) == ["paused"]
        service.start()
        with service.client("alice") as alice:
            shown = alice.get(f"/v1/sandboxes/{sid}").json()
            assert (shown["state"], shown["processes_kept"]) == ("paused", True), shown
            assert shown["expires_at"] > created["expires_at"] + TEMPLATE_TTL, shown
            resumed = alice.post(f"/v1/sandboxes/{sid}/resume").json()
            assert resumed["state"] == "running", resumed
            assert 0 < resumed["expires_at"] - time.time() <= _left(created, created["paused_before"]), resumed
            assert execute(alice, sid, "echo on")["output"] == "on\n"
            assert alice.delete(f"/v1/sandboxes/{sid}").status_code == 204
