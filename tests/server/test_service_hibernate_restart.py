"""Hibernation across a service's ``kill -9`` (a real service process, Docker and the local
jail): a hibernated
sandbox stays listed and paused after the restart and resumes whole; a ``kill -9`` in the
middle of a hibernate leaves the sandbox either running with its files or paused with a complete
snapshot, never neither, and no container nor snapshot behind."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import ServiceProcess, backend_process, execute, owned_containers, started


def _wait(what: str, condition: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.02)


def _service(tmp_path: Path, runtime_image: str, backend: str = "docker") -> tuple[ServiceProcess, str]:
    return backend_process(tmp_path, runtime_image, backend, "hib9")


def _hibernate(client: httpx.Client, sandbox_id: str) -> httpx.Response:
    return client.post(f"/v1/sandboxes/{sandbox_id}/pause", json={"mode": "hibernate", "ttl": "keep"}, timeout=120)


@pytest.mark.parametrize("backend", ["docker", "local"])
def test_a_hibernated_sandbox_outlives_a_kill_9_and_resumes_whole(
    tmp_path: Path, docker_client: Any, runtime_image: str, backend: str
) -> None:
    service, owner = _service(tmp_path, runtime_image, backend)
    with started(service, owner, docker_client):
        with service.client("alice") as alice:
            sandbox = alice.post("/v1/sandboxes", json={"labels": {"team": "qa"}}).json()
            sid = sandbox["id"]
            assert execute(alice, sid, "echo kept > note && chmod 640 note")["exit_code"] == 0
            hibernated = _hibernate(alice, sid)
            assert (hibernated.status_code, hibernated.json()["state"]) == (200, "paused"), hibernated.text
        assert owned_containers(docker_client, owner) == []  # released
        service.kill()
        service.start()
        with service.client("alice") as alice, service.client("bob") as bob:
            shown = alice.get(f"/v1/sandboxes/{sid}").json()
            assert (shown["state"], shown["labels"], shown["processes_kept"]) == ("paused", {"team": "qa"}, False)
            assert bob.get(f"/v1/sandboxes/{sid}").status_code == 404
            resumed = alice.post(f"/v1/sandboxes/{sid}/resume", timeout=120)
            assert (resumed.status_code, resumed.json()["state"]) == (200, "running"), resumed.text
            assert execute(alice, sid, "cat note; stat -c %a note")["output"] == "kept\n640\n"
            assert alice.get("/v1/snapshots").json()["snapshots"] == []  # the hibernation's, gone with it
            assert alice.delete(f"/v1/sandboxes/{sid}").status_code == 204
        assert owned_containers(docker_client, owner) == []


@pytest.mark.slow  # a 64 MiB workspace hibernated, the service killed and started again
def test_a_kill_9_during_a_hibernate_leaves_it_running_or_paused_whole(
    tmp_path: Path, docker_client: Any, runtime_image: str
) -> None:
    service, owner = _service(tmp_path, runtime_image)
    snapshots = tmp_path / "data" / "snapshots"
    with started(service, owner, docker_client):
        with service.client("alice") as alice:
            sid = alice.post("/v1/sandboxes", json={}).json()["id"]
            made = execute(alice, sid, "head -c 67108864 /dev/urandom > blob && sha256sum blob", timeout=120)
            digest = made["output"].split()[0]
            answer: list[httpx.Response | Exception] = []

            def hibernate() -> None:
                try:
                    answer.append(_hibernate(alice, sid))
                except httpx.HTTPError as exc:  # the service was killed under it
                    answer.append(exc)

            thread = threading.Thread(target=hibernate)
            thread.start()
            _wait("the hibernate writes its snapshot", lambda: snapshots.exists() and any(snapshots.rglob("*")))
            service.kill()
            thread.join(30)
        service.start()
        with service.client("alice") as alice:
            shown = alice.get(f"/v1/sandboxes/{sid}")
            assert shown.status_code == 200, shown.text  # never neither
            state = shown.json()["state"]
            assert state in ("running", "paused"), shown.text
            if state == "paused":  # its snapshot is complete: it resumes with every byte
                resumed = alice.post(f"/v1/sandboxes/{sid}/resume", timeout=180)
                assert resumed.status_code == 200, resumed.text
            assert execute(alice, sid, "sha256sum blob", timeout=120)["output"].split()[0] == digest
            assert [s["id"] for s in alice.get("/v1/sandboxes").json()["sandboxes"]] == [sid]
            assert alice.delete(f"/v1/sandboxes/{sid}").status_code == 204
            assert alice.get("/v1/snapshots").json()["snapshots"] == []
        _wait("no container is left", lambda: owned_containers(docker_client, owner) == [])
