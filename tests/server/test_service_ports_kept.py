"""A port made public by ``PUT /v1/sandboxes/{id}/ports/{port}`` stays public across a restart of
the service (over the local jail: its state file; over Docker: the one the replica keeps beside
the container's labels), and a fork of its sandbox has it public too, while a port not made so
stays closed. The app answering is `preview_app.py` in the sandbox, reached through the
service's preview proxy on 127.0.0.1."""

from __future__ import annotations

import base64
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import Running, create, running, settings_for, start_process
from support import HAS_BWRAP, SESSION_OWNER, needs

from sandboxes.docker import DockerTemplate
from sandboxes.local import LocalTemplate

APP_PORT = 8000
CLOSED_PORT = 8001
CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}


def _settings(kind: str, request: pytest.FixtureRequest, data_dir: Path) -> tuple[Any, Any]:
    if kind == "docker":
        image = request.getfixturevalue("runtime_image")
        template: Any = DockerTemplate(backend="docker", image=image, cpus=1, memory="512m", labels=CLEANUP)
        docker_client = request.getfixturevalue("docker_client")
    else:
        needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
        template, docker_client = LocalTemplate(default_timeout=60), None
    owner = f"{SESSION_OWNER}-portkept-{uuid.uuid4().hex[:6]}"
    return settings_for(data_dir, owner=owner, templates={"default": template}), docker_client


def _serve(client: httpx.Client, sandbox: dict[str, Any], port: int = APP_PORT) -> None:
    """`preview_app.py` listening on ``port`` in the sandbox, as its key reaches it (started
    again if it is not: one left from before a restart keeps the port and answers)."""
    app = (Path(__file__).parent / "preview_app.py").read_bytes()
    upload = {"files": [{"path": f"{sandbox['workdir']}/app.py", "content_b64": base64.b64encode(app).decode()}]}
    assert client.post(f"/v1/sandboxes/{sandbox['id']}/files/upload", json=upload).status_code == 200
    start_process(client, sandbox["id"], f"exec python3 app.py {port}")
    deadline = time.monotonic() + 30
    while (answer := client.get(f"/v1/sandboxes/{sandbox['id']}/ports/{port}/health")).status_code != 200:
        assert answer.status_code == 502, answer.text  # nothing listens yet
        assert time.monotonic() < deadline, "the app in the sandbox never listened"
        time.sleep(0.05)


def _set_public(client: httpx.Client, sandbox_id: str, public: bool) -> None:
    answer = client.put(f"/v1/sandboxes/{sandbox_id}/ports/{APP_PORT}", json={"public": public})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"sandbox_id": sandbox_id, "port": APP_PORT, "public": public}


def _anonymous(service: Running, sandbox_id: str, port: int = APP_PORT) -> httpx.Response:
    """A request with neither key nor token to the sandbox's port, through the preview proxy."""
    with service.client(None) as stranger:
        return stranger.get(f"/v1/sandboxes/{sandbox_id}/ports/{port}/health")


@pytest.mark.parametrize("kind", ["local", "docker"])
def test_a_public_port_stays_public_across_a_restart(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    settings, docker_client = _settings(kind, request, tmp_path)
    with running(settings, docker_client=docker_client) as first, first.client("alice") as alice:
        sandbox = create(alice, template="default")
        _set_public(alice, sandbox["id"], True)
    kept = tmp_path / "state" / f"{sandbox['id']}.json"
    assert kept.stat().st_mode & 0o777 == 0o600
    with running(settings, docker_client=docker_client) as second, second.client("alice") as alice:
        try:
            first_seen = _anonymous(second, sandbox["id"])  # before any request with its key
            assert first_seen.status_code in (200, 502), first_seen.text  # let through: served or not listening
            _serve(alice, sandbox)
            _serve(alice, sandbox, CLOSED_PORT)
            answer = _anonymous(second, sandbox["id"])
            assert answer.status_code == 200, answer.text
            assert answer.text == "ok"  # the sandbox's app answered
            assert _anonymous(second, sandbox["id"], CLOSED_PORT).status_code == 401  # never made public
            _set_public(alice, sandbox["id"], False)
            assert _anonymous(second, sandbox["id"]).status_code == 401
        finally:
            alice.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_a_fork_has_its_parents_public_ports_public(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    settings, _ = _settings("local", request, tmp_path)
    with running(settings) as service, service.client("alice") as alice:
        parent = create(alice, template="default")
        made: list[str] = [parent["id"]]
        try:
            _set_public(alice, parent["id"], True)
            forked = alice.post(f"/v1/sandboxes/{parent['id']}/fork", json={"count": 1})
            assert forked.status_code in (200, 201), forked.text
            child = forked.json()["sandboxes"][0]
            made.append(child["id"])
            _serve(alice, child)
            _serve(alice, child, CLOSED_PORT)
            answer = _anonymous(service, child["id"])
            assert answer.status_code == 200, answer.text
            assert answer.text == "ok"
            assert _anonymous(service, child["id"], CLOSED_PORT).status_code == 401
            _set_public(alice, child["id"], False)  # the child's own setting: its parent's port stays public
            assert _anonymous(service, child["id"]).status_code == 401
            _serve(alice, parent)
            assert _anonymous(service, parent["id"]).status_code == 200
        finally:
            for sandbox_id in made:
                alice.delete(f"/v1/sandboxes/{sandbox_id}")
