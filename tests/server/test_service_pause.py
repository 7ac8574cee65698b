"""Pause and resume through the service, on the local jail and on Docker: a running process's
counter stops while the sandbox is frozen and goes on after it resumes, its files come back
whole, an operation on a paused sandbox answers ``paused`` (or resumes it, with
``auto_resume``), and the TTL keeps running or stops as the pause asked, on the service's
clock (a `ManualClock`: no waiting for a TTL)."""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b_harness import service_fixture
from service_harness import KEYS, ManualClock, Running, create, execute, running, settings_for, start_process
from support import SESSION_OWNER, wait_for

from sandboxes.client import SandboxClient
from sandboxes.docker import DockerTemplate

CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}
COUNTER = "i=0; while :; do i=$((i + 1)); echo $i > count.tmp; mv count.tmp count; sleep 0.02; done"
"""Counts, about fifty a second, into ``count`` of its working directory (renamed whole: a read
never sees half a number)."""
BINARY = bytes(range(256)) * 64
_COMMAND_LINES = r"for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' <$f; echo; done"
"""The command line of every process the sandbox sees, one a line."""


service = service_fixture("pause", manual_clock=True)


@pytest.fixture
def client(service: Running) -> Iterator[httpx.Client]:
    with service.client("alice") as client:
        yield client


def _count_outside(service: Running, sandbox_id: str) -> int:
    """The counter's last number, read from outside the sandbox (a frozen one answers nothing)."""
    sandbox = service.registry._entries[sandbox_id].sandbox
    if hasattr(sandbox, "container"):
        chunks, _ = sandbox.container.get_archive(f"{sandbox.workdir}/count")
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            member = tar.extractfile("count")
            assert member is not None
            return int(member.read())
    return int((Path(sandbox.root) / "count").read_text())


def _count_inside(client: httpx.Client, sandbox_id: str) -> int:
    return int(execute(client, sandbox_id, "cat count")["output"])


def _pause(client: httpx.Client, sandbox_id: str, ttl: str = "keep") -> dict[str, Any]:
    response = client.post(f"/v1/sandboxes/{sandbox_id}/pause", json={"ttl": ttl})
    assert response.status_code == 200, response.text
    paused: dict[str, Any] = response.json()
    return paused


def test_a_paused_sandbox_stops_counting_keeps_its_files_and_goes_on_after_resume(
    service: Running, client: httpx.Client
) -> None:
    sandbox = create(client)
    sid = sandbox["id"]
    try:
        upload = {
            "files": [{"path": f"{sandbox['workdir']}/blob.bin", "content_b64": base64.b64encode(BINARY).decode()}]
        }
        assert client.post(f"/v1/sandboxes/{sid}/files/upload", json=upload).status_code == 200
        start_process(client, sid, COUNTER)
        wait_for(lambda: execute(client, sid, "cat count 2>/dev/null")["output"].strip() != "", "the counter")

        paused = _pause(client, sid)
        assert paused["state"] == "paused"
        assert client.get(f"/v1/sandboxes/{sid}").json()["state"] == "paused"
        listed = {item["id"]: item["state"] for item in client.get("/v1/sandboxes").json()["sandboxes"]}
        assert listed[sid] == "paused"
        frozen_at = _count_outside(service, sid)
        time.sleep(0.3)  # an observation window: a running counter moves ~15 times in it
        assert _count_outside(service, sid) == frozen_at, "the counter moved while the sandbox was paused"

        refused = client.post(f"/v1/sandboxes/{sid}/execute", json={"command": "echo hi"})
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"] == "paused"
        assert "resume" in refused.json()["message"]
        again = client.post(f"/v1/sandboxes/{sid}/pause", json={})
        assert (again.status_code, again.json()["error"]) == (409, "paused")

        resumed = client.post(f"/v1/sandboxes/{sid}/resume")
        assert (resumed.status_code, resumed.json()["state"]) == (200, "running")
        wait_for(lambda: _count_inside(client, sid) > frozen_at + 2, "the counter to go on after resume")
        download = client.post(
            f"/v1/sandboxes/{sid}/files/download", json={"paths": [f"{sandbox['workdir']}/blob.bin"]}
        )
        assert base64.b64decode(download.json()[0]["content_b64"]) == BINARY
    finally:
        client.delete(f"/v1/sandboxes/{sid}")


def test_an_auto_resume_sandbox_is_resumed_by_an_operation(client: httpx.Client) -> None:
    sid = create(client, auto_resume=True)["id"]
    try:
        _pause(client, sid)
        assert execute(client, sid, "echo awake")["output"] == "awake\n"
        assert client.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
    finally:
        client.delete(f"/v1/sandboxes/{sid}")


def test_the_ttl_runs_while_paused_with_keep(service: Running, client: httpx.Client) -> None:
    sid = create(client, ttl=100)["id"]
    _pause(client, sid, "keep")
    service.registry.clock.advance(101)
    service.sweep()
    assert client.get(f"/v1/sandboxes/{sid}").status_code == 404


def test_the_ttl_stops_while_paused_with_stop_and_what_was_left_is_given_back(
    service: Running, client: httpx.Client
) -> None:
    clock = service.registry.clock
    created = create(client, ttl=100)
    sid = created["id"]
    try:
        left = created["expires_at"] - clock.now()
        _pause(client, sid, "stop")
        clock.advance(500)
        service.sweep()
        assert client.get(f"/v1/sandboxes/{sid}").json()["state"] == "paused"
        resumed = client.post(f"/v1/sandboxes/{sid}/resume").json()
        assert resumed["expires_at"] - clock.now() == pytest.approx(left, abs=1.5)  # a shared backend's: whole s
        clock.advance(left + 2)
        service.sweep()
        assert client.get(f"/v1/sandboxes/{sid}").status_code == 404
    finally:
        client.delete(f"/v1/sandboxes/{sid}")


def test_a_sandbox_created_to_freeze_at_its_ttl_is_paused_then_removed_after_max_ttl(
    service: Running, client: httpx.Client
) -> None:
    clock, max_ttl = service.registry.clock, service.registry.settings.max_ttl
    sid = create(client, ttl=100, on_timeout="freeze")["id"]
    try:
        execute(client, sid, "printf 'before the pause' > kept.txt")
        clock.advance(101)
        service.sweep()
        paused = client.get(f"/v1/sandboxes/{sid}").json()
        assert (paused["state"], paused["processes_kept"]) == ("paused", True)
        assert paused["expires_at"] - clock.now() == pytest.approx(max_ttl, abs=1.5)  # its retention, bounded
        refused = client.post(f"/v1/sandboxes/{sid}/execute", json={"command": "true"})
        assert (refused.status_code, refused.json()["error"]) == (409, "paused")

        resumed = client.post(f"/v1/sandboxes/{sid}/resume").json()
        assert resumed["expires_at"] - clock.now() == pytest.approx(3600, abs=1.5)  # its template's TTL again
        assert execute(client, sid, "cat kept.txt")["output"] == "before the pause"

        clock.advance(3601)
        service.sweep()
        assert client.get(f"/v1/sandboxes/{sid}").json()["state"] == "paused"  # paused again, not removed
        clock.advance(max_ttl + 1)
        service.sweep()
        assert client.get(f"/v1/sandboxes/{sid}").status_code == 404  # a pause that outlives its retention ends
    finally:
        client.delete(f"/v1/sandboxes/{sid}")


def test_a_sandbox_created_to_hibernate_at_its_ttl_keeps_its_files_and_auto_resume_wakes_it(
    service: Running, client: httpx.Client
) -> None:
    clock = service.registry.clock
    created = create(client, ttl=100, on_timeout="hibernate", auto_resume=True)
    sid = created["id"]
    try:
        blob = {"path": f"{created['workdir']}/blob.bin", "content_b64": base64.b64encode(BINARY).decode()}
        assert client.post(f"/v1/sandboxes/{sid}/files/upload", json={"files": [blob]}).status_code == 200
        clock.advance(101)
        service.sweep()
        paused = client.get(f"/v1/sandboxes/{sid}").json()
        assert (paused["state"], paused["processes_kept"]) == ("paused", False)
        assert execute(client, sid, "sha256sum blob.bin")["output"].split()[0] == hashlib.sha256(BINARY).hexdigest()
        assert client.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
    finally:
        client.delete(f"/v1/sandboxes/{sid}")


def test_the_client_asks_for_a_pause_at_the_ttl(service: Running) -> None:
    with SandboxClient(service.url, KEYS["alice"]) as sdk:
        sandbox = sdk.create(ttl=100, on_timeout="hibernate")
        try:
            service.registry.clock.advance(101)
            service.sweep()
            assert sandbox.refresh().state == "paused"
        finally:
            sandbox.destroy()


@pytest.mark.parametrize("auto_resume", [True, False])
def test_a_request_to_a_port_of_a_sandbox_paused_at_its_ttl_wakes_it_only_with_auto_resume(
    service: Running, client: httpx.Client, auto_resume: bool
) -> None:
    sid = create(client, ttl=100, on_timeout="freeze", auto_resume=auto_resume)["id"]
    port = f"/v1/sandboxes/{sid}/ports/8000/"
    try:
        start_process(client, sid, "python3 -m http.server 8000 --bind 127.0.0.1")
        wait_for(lambda: client.get(port).status_code == 200, "the server on port 8000")
        service.registry.clock.advance(101)
        service.sweep()
        assert client.get(f"/v1/sandboxes/{sid}").json()["state"] == "paused"
        answer = client.get(port)
        if auto_resume:
            assert answer.status_code == 200
            assert client.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
        else:
            assert (answer.status_code, answer.json()["error"]) == (409, "paused")
    finally:
        client.delete(f"/v1/sandboxes/{sid}")


def test_a_sandbox_frozen_at_its_ttl_on_docker_is_read_back_as_it_was_after_a_restart(
    docker_client: Any, runtime_image: str, tmp_path: Path
) -> None:
    """Paused at its timeout, across a restart of the service (its state file kept beside its
    container's labels, which say frozen alone): the same expiry, its processes kept, a resume
    gives its template's TTL, and one not resumed is removed at its retention's end."""
    template = DockerTemplate(backend="docker", image=runtime_image, cpus=0.5, memory="256m", labels=CLEANUP)
    owner = f"{SESSION_OWNER}-pausert-{uuid.uuid4().hex[:6]}"
    settings = settings_for(tmp_path, owner=owner, templates={"default": template})
    clock, max_ttl = ManualClock(), settings.max_ttl
    with running(settings, docker_client=docker_client, clock=clock) as first, first.client() as client:
        resumed_id, left_id = (create(client, ttl=100, on_timeout="freeze")["id"] for _ in range(2))
        start_process(client, resumed_id, COUNTER)
        wait_for(lambda: execute(client, resumed_id, "cat count 2>/dev/null")["output"].strip() != "", "the counter")
        clock.advance(101)
        first.sweep()
        before = {sid: client.get(f"/v1/sandboxes/{sid}").json() for sid in (resumed_id, left_id)}
        frozen_at = _count_outside(first, resumed_id)
    with running(settings, docker_client=docker_client, clock=clock) as second, second.client() as client:
        try:
            for sid in (resumed_id, left_id):
                shown = client.get(f"/v1/sandboxes/{sid}").json()
                assert (shown["state"], shown["processes_kept"]) == ("paused", True)
                assert shown["expires_at"] == before[sid]["expires_at"]  # its retention's end, as it was
                assert shown["expires_at"] - clock.now() == pytest.approx(max_ttl, abs=1.5)
            resumed = client.post(f"/v1/sandboxes/{resumed_id}/resume").json()
            assert resumed["state"] == "running"
            assert resumed["expires_at"] - clock.now() == pytest.approx(3600, abs=1.5)  # its template's TTL again
            wait_for(lambda: _count_inside(client, resumed_id) > frozen_at + 2, "the counter to go on after resume")
            assert not (tmp_path / "state" / f"{resumed_id}.json").exists()  # running: its labels say it all

            clock.advance(max_ttl + 1)
            second.sweep()
            assert client.get(f"/v1/sandboxes/{left_id}").status_code == 404  # its retention ended
            assert not (tmp_path / "state" / f"{left_id}.json").exists()
            assert len(docker_client.containers.list(all=True, filters={"label": f"io.sandboxes.owner={owner}"})) == 1
            assert client.get(f"/v1/sandboxes/{resumed_id}").json()["state"] == "paused"  # at its TTL again
        finally:
            for sid in (resumed_id, left_id):
                client.delete(f"/v1/sandboxes/{sid}")


def test_a_sandbox_paused_with_its_clock_stopped_on_docker_is_read_back_as_it_was_after_a_restart(
    docker_client: Any, runtime_image: str, tmp_path: Path
) -> None:
    """Paused with ``ttl: stop``, across a restart of the service (its state file kept beside its
    container's labels, which say frozen alone): still paused with its processes kept, no expiry
    removes it meanwhile, and a resume gives back the seconds it had left."""
    template = DockerTemplate(backend="docker", image=runtime_image, cpus=0.5, memory="256m", labels=CLEANUP)
    owner = f"{SESSION_OWNER}-pausest-{uuid.uuid4().hex[:6]}"
    settings = settings_for(tmp_path, owner=owner, templates={"default": template})
    clock = ManualClock()
    with running(settings, docker_client=docker_client, clock=clock) as first, first.client() as client:
        sid = create(client, ttl=100)["id"]
        start_process(client, sid, COUNTER)
        wait_for(lambda: execute(client, sid, "cat count 2>/dev/null")["output"].strip() != "", "the counter")
        clock.advance(40)
        _pause(client, sid, "stop")
        frozen_at = _count_outside(first, sid)
    with running(settings, docker_client=docker_client, clock=clock) as second, second.client() as client:
        try:
            shown = client.get(f"/v1/sandboxes/{sid}").json()
            assert (shown["state"], shown["processes_kept"]) == ("paused", True)
            clock.advance(100)  # past the end of its TTL, had its clock run
            second.sweep()
            assert client.get(f"/v1/sandboxes/{sid}").json()["state"] == "paused"
            resumed = client.post(f"/v1/sandboxes/{sid}/resume").json()
            assert resumed["state"] == "running"
            assert resumed["expires_at"] - clock.now() == pytest.approx(60, abs=1.5)  # the seconds it had left
            wait_for(lambda: _count_inside(client, sid) > frozen_at + 2, "the counter to go on after resume")
            assert not (tmp_path / "state" / f"{sid}.json").exists()  # running: its labels say it all
        finally:
            client.delete(f"/v1/sandboxes/{sid}")


def test_a_frozen_local_sandbox_is_read_back_with_its_processes_ended_after_a_restart(tmp_path: Path) -> None:
    """A local jail ends with the service holding it: a sandbox frozen there (by a pause, or at
    its timeout) reads back after a restart paused with its processes not kept, and a resume
    gives it its files, its counter where it stopped and its TTL as its pause said."""
    clock, settings = ManualClock(), settings_for(tmp_path)
    with running(settings, clock=clock) as first, first.client() as client:
        paused_id, timed_id = create(client, ttl=100)["id"], create(client, ttl=100, on_timeout="freeze")["id"]
        for sid in (paused_id, timed_id):
            start_process(client, sid, COUNTER)
            wait_for(lambda sid=sid: execute(client, sid, "cat count 2>/dev/null")["output"].strip() != "", "count")
            assert "while :" in execute(client, sid, _COMMAND_LINES)["output"]  # what sees it running
        clock.advance(40)
        assert _pause(client, paused_id, "stop")["processes_kept"] is True
        clock.advance(61)
        first.sweep()
        assert client.get(f"/v1/sandboxes/{timed_id}").json()["processes_kept"] is True  # frozen at its timeout
        frozen_at = {sid: _count_outside(first, sid) for sid in (paused_id, timed_id)}
    for _ in range(2):  # and again: what it is now is what its state file says
        with running(settings, clock=clock) as again, again.client() as client:
            for sid in (paused_id, timed_id):
                shown = client.get(f"/v1/sandboxes/{sid}").json()
                assert (shown.get("state"), shown.get("processes_kept")) == ("paused", False), shown
    with running(settings, clock=clock) as last, last.client() as client:
        try:
            for sid, ttl_left in ((paused_id, 60), (timed_id, 3600)):
                resumed = client.post(f"/v1/sandboxes/{sid}/resume").json()
                assert (resumed["state"], resumed["processes_kept"]) == ("running", None)
                assert resumed["expires_at"] - clock.now() == pytest.approx(ttl_left, abs=1.5)
                assert _count_inside(client, sid) == frozen_at[sid]  # its files, as they were when frozen
                assert "while :" not in execute(client, sid, _COMMAND_LINES)["output"]  # its counter ended
        finally:
            for sid in (paused_id, timed_id):
                client.delete(f"/v1/sandboxes/{sid}")
