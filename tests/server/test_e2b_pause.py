"""The real E2B SDK's pause, connect-resumes and resume against the service's E2B API
(`sandboxes.server.e2b.control`), over the local jail: a paused sandbox is listed and shown
``paused``, its envd answers as E2B's does for a paused sandbox (not running), ``pause`` of a
paused one says so (``False``), and ``connect`` resumes it with its files and processes; a
backend without a freezer answers E2B's error shape, and hibernates a sandbox that asked to be
frozen at the end of its TTL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import toy_backend  # noqa: F401  (registers the toy backend's template)
from e2b import Sandbox, SandboxQuery, SandboxState
from service_harness import KEYS, Running, execute, running, settings_for
from support import HAS_BWRAP, SESSION_OWNER, needs, wait_for

from sandboxes.local import LocalTemplate


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    needs(HAS_BWRAP, "bubblewrap is not installed")
    owner = f"{SESSION_OWNER}-e2bp-{uuid.uuid4().hex[:6]}"
    templates: dict[str, Any] = {
        "default": LocalTemplate(default_timeout=30),
        "toy": {"backend": "toy", "default_timeout": 30},  # tests/toy_backend: no freezer
    }
    settings = settings_for(tmp_path_factory.mktemp("e2bp"), owner=owner, templates=templates)
    with running(settings) as svc:
        yield svc


def _opts(service: Running) -> dict[str, Any]:
    return {"api_key": KEYS["alice"], "api_url": f"{service.url}/e2b", "sandbox_url": f"{service.url}/e2b/envd"}


def test_pause_then_connect_resumes_with_files_and_processes(service: Running) -> None:
    sandbox = Sandbox.create(**_opts(service))
    try:
        sandbox.files.write("kept.txt", "still here\n")
        sandbox.commands.run("sleep 600", background=True)
        assert sandbox.pause() is True
        assert sandbox.get_info().state == SandboxState.PAUSED
        assert not sandbox.is_running()
        paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED]), **_opts(service)).next_items()
        assert [item.sandbox_id for item in paused] == [sandbox.sandbox_id]
        assert Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING]), **_opts(service)).next_items() == []
        assert sandbox.pause() is False  # paused already: E2B's 409

        connected = Sandbox.connect(sandbox.sandbox_id, **_opts(service))
        assert connected.get_info().state == SandboxState.RUNNING
        assert connected.files.read("kept.txt") == "still here\n"
        assert "sleep 600" in connected.commands.run("ps -eo args").stdout
    finally:
        sandbox.kill()


def test_resume_answers_201_then_409(service: Running) -> None:
    sandbox = Sandbox.create(**_opts(service))
    headers = {"X-API-KEY": KEYS["alice"]}
    try:
        with httpx.Client(base_url=f"{service.url}/e2b", headers=headers) as http:
            assert http.post(f"/sandboxes/{sandbox.sandbox_id}/pause", json={}).status_code == 204
            resumed = http.post(f"/sandboxes/{sandbox.sandbox_id}/resume", json={})
            assert (resumed.status_code, resumed.json()["sandboxID"]) == (201, sandbox.sandbox_id)
            again = http.post(f"/sandboxes/{sandbox.sandbox_id}/resume", json={})
            assert again.status_code == 409
            assert again.json() == {"code": 409, "message": f"sandbox {sandbox.sandbox_id} is not paused"}
    finally:
        sandbox.kill()


def test_a_backend_without_a_freezer_answers_unavailable(service: Running, tmp_path: Path) -> None:
    with service.client("alice") as client:
        created = client.post("/v1/sandboxes", json={"template": "toy"})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        try:
            refused = client.post(f"/v1/sandboxes/{sid}/pause", json={})
            assert refused.status_code == 501, refused.text
            assert refused.json()["error"] == "unavailable"
            assert "cannot pause" in refused.json()["message"]
            assert client.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
        finally:
            client.delete(f"/v1/sandboxes/{sid}")


def test_a_filesystem_pause_hibernates_and_connect_brings_the_files_back(service: Running) -> None:
    sandbox = Sandbox.create(**_opts(service))
    try:
        sandbox.files.write("kept.txt", "on disk\n")
        assert sandbox.pause(mode="filesystem") is True
        assert sandbox.get_info().state == SandboxState.PAUSED
        assert service.registry._entries[sandbox.sandbox_id].state.hibernated
        connected = Sandbox.connect(sandbox.sandbox_id, **_opts(service))
        assert connected.files.read("kept.txt") == "on disk\n"
    finally:
        sandbox.kill()


def test_a_freeze_at_the_ttl_on_a_backend_without_a_freezer_hibernates_with_the_files(service: Running) -> None:
    with service.client("alice") as client:
        created = client.post("/v1/sandboxes", json={"template": "toy", "ttl": 1, "on_timeout": "freeze"})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        try:
            execute(client, sid, "printf 'kept' > kept.txt")
            wait_for(lambda: client.get(f"/v1/sandboxes/{sid}").json()["state"] == "paused", "no pause at the TTL")
            assert client.get(f"/v1/sandboxes/{sid}").json()["processes_kept"] is False  # hibernated
            assert client.post(f"/v1/sandboxes/{sid}/resume").status_code == 200
            assert execute(client, sid, "cat kept.txt")["output"] == "kept"
        finally:
            client.delete(f"/v1/sandboxes/{sid}")
