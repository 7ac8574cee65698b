"""Hibernation through the service, on the local jail and on Docker: the workspace is kept in a
snapshot and the container or jail released; the sandbox stays listed, paused, with its id and
labels (a shared backend's record is gone, and re-reading records every time loses nothing);
resume makes it again from the snapshot, verified, with every byte and mode back; one that
expires while hibernated is removed with its snapshot."""

from __future__ import annotations

import base64
import shutil
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b_harness import service_fixture
from service_harness import Running, create, execute, heartbeat, heartbeat_stopped, start_process, wait_beating
from support import SESSION_OWNER

from sandboxes.server import snapshots

CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}
BINARY = bytes(range(256)) * 300


service = service_fixture("hib", manual_clock=True, confirm_interval=0)


def _hibernate(client: httpx.Client, sandbox_id: str, ttl: str = "keep") -> dict[str, Any]:
    response = client.post(f"/v1/sandboxes/{sandbox_id}/pause", json={"mode": "hibernate", "ttl": ttl})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _released(service: Running, ref: str) -> bool:
    """Whether the backend has nothing left of the sandbox ``ref``."""
    backend = next(iter(service.registry.backends.values()))
    return all(record.ref != ref for record in backend.provider.list())


def test_a_hibernated_sandbox_is_released_and_comes_back_whole(service: Running) -> None:
    with service.client("alice") as client:
        sandbox = create(client, labels={"team": "qa"})
        sid, workdir = sandbox["id"], sandbox["workdir"]
        upload = {"files": [{"path": f"{workdir}/blob.bin", "content_b64": base64.b64encode(BINARY).decode()}]}
        assert client.post(f"/v1/sandboxes/{sid}/files/upload", json=upload).status_code == 200
        assert execute(client, sid, "mkdir -p d && echo s > d/secret && chmod 600 d/secret")["exit_code"] == 0
        ref = service.registry._entries[sid].state.ref
        try:
            assert _hibernate(client, sid)["state"] == "paused"
            assert _released(service, ref)
            shown = client.get(f"/v1/sandboxes/{sid}").json()
            assert (shown["state"], shown["labels"]) == ("paused", {"team": "qa"})
            assert [item["id"] for item in client.get("/v1/sandboxes").json()["sandboxes"]] == [sid]
            refused = client.post(f"/v1/sandboxes/{sid}/execute", json={"command": "true"})
            assert (refused.status_code, refused.json()["error"]) == (409, "paused")
            assert len(client.get("/v1/snapshots").json()["snapshots"]) == 1  # the workspace, kept

            resumed = client.post(f"/v1/sandboxes/{sid}/resume")
            assert (resumed.status_code, resumed.json()["state"]) == (200, "running")
            assert service.registry._entries[sid].state.ref != ref
            assert execute(client, sid, "cat d/secret; stat -c %a d/secret")["output"] == "s\n600\n"
            again = resumed.json()["workdir"]  # a local sandbox's root is a new directory
            download = client.post(f"/v1/sandboxes/{sid}/files/download", json={"paths": [f"{again}/blob.bin"]})
            assert base64.b64decode(download.json()[0]["content_b64"]) == BINARY
            assert client.get("/v1/snapshots").json()["snapshots"] == []
        finally:
            client.delete(f"/v1/sandboxes/{sid}")


def test_a_sandbox_expiring_while_hibernated_is_removed_with_its_snapshot(service: Running) -> None:
    with service.client("alice") as client:
        sid = create(client, ttl=100)["id"]
        _hibernate(client, sid, "keep")
        service.registry.clock.advance(101)
        service.sweep()
        assert client.get(f"/v1/sandboxes/{sid}").status_code == 404
        assert client.get("/v1/snapshots").json()["snapshots"] == []


def test_paths_of_the_local_sandbox_are_gone_once_hibernated(service: Running, tmp_path: Path) -> None:
    with service.client("alice") as client:
        sandbox = create(client)
        try:
            _hibernate(client, sandbox["id"], "stop")
            if sandbox["backend"] == "local":
                assert not Path(sandbox["workdir"]).exists()
            assert client.post(f"/v1/sandboxes/{sandbox['id']}/resume").json()["state"] == "running"
        finally:
            client.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_a_hibernate_says_the_processes_ended_and_they_did(service: Running) -> None:
    with service.client("alice") as client:
        sid = create(client)["id"]
        try:
            assert client.get(f"/v1/sandboxes/{sid}").json()["processes_kept"] is None
            wait_beating(client, sid, "beat", process=start_process(client, sid, heartbeat("beat")))
            frozen = client.post(f"/v1/sandboxes/{sid}/pause", json={"mode": "freeze"})
            assert (frozen.status_code, frozen.json()["processes_kept"]) == (200, True)
            assert client.post(f"/v1/sandboxes/{sid}/resume").json()["processes_kept"] is None

            assert _hibernate(client, sid)["processes_kept"] is False
            assert client.get(f"/v1/sandboxes/{sid}").json()["processes_kept"] is False
            assert client.post(f"/v1/sandboxes/{sid}/resume").json()["processes_kept"] is None
            assert heartbeat_stopped(client, sid, "beat")  # its files came back; the counter did not
        finally:
            client.delete(f"/v1/sandboxes/{sid}")


def test_a_hibernate_keeping_memory_is_refused_and_the_sandbox_runs_on(service: Running) -> None:
    with service.client("alice") as client:
        sid = create(client)["id"]
        try:
            wait_beating(client, sid, "beat", process=start_process(client, sid, heartbeat("beat")))
            refused = client.post(f"/v1/sandboxes/{sid}/pause", json={"mode": "hibernate", "memory": True})
            assert (refused.status_code, refused.json()["error"]) == (501, "unavailable"), refused.text
            assert "CRIU" in refused.json()["message"]
            shown = client.get(f"/v1/sandboxes/{sid}").json()
            assert (shown["state"], shown["processes_kept"]) == ("running", None)
            assert client.get("/v1/snapshots").json()["snapshots"] == []
            wait_beating(client, sid, "beat")  # the counter still counts
        finally:
            client.delete(f"/v1/sandboxes/{sid}")


def test_a_resume_answers_before_its_snapshots_files_are_removed(
    service: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kept snapshot is out of sight once resumed; its files are removed on a thread of
    their own, which the answer does not wait for."""
    release, removed, late = threading.Event(), threading.Event(), []
    rmtree = shutil.rmtree

    def held(path: Any, ignore_errors: bool = False) -> None:
        if ".gone-" in str(path):
            late.append(not release.wait(20))
            rmtree(path, ignore_errors)
            removed.set()
        else:
            rmtree(path, ignore_errors)

    with service.client("alice") as client:
        sid = create(client)["id"]
        try:
            _hibernate(client, sid)
            monkeypatch.setattr(snapshots.shutil, "rmtree", held)
            resumed = client.post(f"/v1/sandboxes/{sid}/resume")
            assert (resumed.status_code, resumed.json()["state"]) == (200, "running")
            assert late == []  # answered while the removal waits
            assert client.get("/v1/snapshots").json()["snapshots"] == []
            release.set()
            assert removed.wait(20)
            assert late == [False]
            assert not list(Path(service.registry.snapshots.directory).glob("*/.gone-*"))
        finally:
            release.set()
            client.delete(f"/v1/sandboxes/{sid}")
