"""Preview URLs (`sandboxes.server.preview_proxy`): a web app started INSIDE a sandbox (a local
jail or a Docker container, no network but its loopback) is reached through the service, a real uvicorn on 127.0.0.1,
by path and by Host; bodies stream both ways, a WebSocket echoes, server-sent events arrive as
sent; who may reach it (the key, a preview token, a public port) and who may not."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import KEYS, ManualClock, Running, create, running, settings_for, start_process
from support import HAS_BWRAP, SESSION_OWNER, needs
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from sandboxes.client import PortUnreachable, SandboxClient
from sandboxes.docker import DockerTemplate
from sandboxes.local import LocalTemplate

APP_PORT = 8000
DOMAIN = "preview.test"
CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}


@dataclass
class Preview:
    service: Running
    clock: ManualClock
    sandbox_id: str
    alice: httpx.Client

    @property
    def base(self) -> str:
        return f"/v1/sandboxes/{self.sandbox_id}/ports/{APP_PORT}"

    def anonymous(self) -> httpx.Client:
        return self.service.client(None)


@pytest.fixture(scope="module", params=["local", "docker"])
def preview(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Preview]:
    """The app running in a sandbox of the service, on a local jail or in a Docker container."""
    docker_client = None
    if request.param == "local":
        needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
        template: Any = LocalTemplate(default_timeout=30)
    else:
        docker_client = request.getfixturevalue("docker_client")
        image = request.getfixturevalue("runtime_image")
        template = DockerTemplate(backend="docker", image=image, cpus=1, memory="512m", labels=CLEANUP)
    clock = ManualClock()
    owner = f"{SESSION_OWNER}-ports-{uuid.uuid4().hex[:6]}"
    settings = settings_for(
        tmp_path_factory.mktemp("ports"), owner=owner, templates={"default": template}, preview_domain=DOMAIN
    )
    with running(settings, clock=clock, docker_client=docker_client) as service, service.client("alice") as alice:
        sandbox = create(alice, template="default")
        app = (Path(__file__).parent / "preview_app.py").read_text()
        upload = {"files": [{"path": f"{sandbox['workdir']}/app.py", "content_b64": _b64(app.encode())}]}
        assert alice.post(f"/v1/sandboxes/{sandbox['id']}/files/upload", json=upload).status_code == 200
        start_process(alice, sandbox["id"], f"exec python3 app.py {APP_PORT}")
        ready = Preview(service, clock, sandbox["id"], alice)
        try:
            _wait_listening(ready)
            yield ready
        finally:
            alice.delete(f"/v1/sandboxes/{sandbox['id']}")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _wait_listening(preview: Preview) -> None:
    deadline = time.monotonic() + 30
    while (answer := preview.alice.get(f"{preview.base}/health")).status_code != 200:
        assert answer.status_code == 502, answer.text  # nothing listens yet
        assert time.monotonic() < deadline, "the app in the sandbox never listened"
        time.sleep(0.05)
    assert answer.text == "ok"


def test_a_fifty_mib_response_streams_through(preview: Preview) -> None:
    size = 50 << 20
    digest, total = hashlib.sha256(), 0
    with preview.alice.stream("GET", f"{preview.base}/big", params={"n": size}) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-length"] == str(size)
        for chunk in answer.iter_bytes():
            digest.update(chunk)
            total += len(chunk)
    assert total == size
    pattern = bytes(range(256)) * 256
    assert digest.digest() == hashlib.sha256(pattern * (size // len(pattern))).digest()


def test_a_request_body_streams_in_and_hop_by_hop_headers_and_credentials_stay_out(preview: Preview) -> None:
    body = b"y" * (3 << 20)
    pieces = iter([body[: 1 << 20], body[1 << 20 :]])  # streamed, its length declared
    answer = preview.alice.post(f"{preview.base}/echo", content=pieces, headers={"Content-Length": str(len(body))})
    assert answer.status_code == 200
    assert answer.json() == {"length": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    seen = preview.alice.get(f"{preview.base}/headers", headers={"X-Custom": "kept", "Keep-Alive": "5"}).json()
    lowered = {key.lower(): value for key, value in seen.items()}
    assert lowered["x-custom"] == "kept"
    assert "authorization" not in lowered  # the tenant's key never reaches the sandbox
    assert "keep-alive" not in lowered
    assert lowered["x-forwarded-proto"] == "http"


def test_server_sent_events_arrive_as_they_are_sent(preview: Preview) -> None:
    with preview.alice.stream("GET", f"{preview.base}/sse") as events:
        assert events.headers["content-type"] == "text/event-stream"
        lines = events.iter_lines()
        assert next(lines) == "data: first"  # before the app was told to send the rest
        assert preview.alice.get(f"{preview.base}/release").status_code == 200
        rest = [line for line in lines if line]
    assert rest == ["data: event 2", "data: event 3", "data: event 4"]


def test_a_websocket_echoes_through(preview: Preview) -> None:
    url = preview.service.url.replace("http://", "ws://") + f"{preview.base}/ws"
    with ws_connect(url, additional_headers={"Authorization": f"Bearer {KEYS['alice']}"}) as socket:
        socket.send("hello")
        assert socket.recv(timeout=10) == "hello"
        socket.send(b"\x00\x01" * 40_000)
        assert socket.recv(timeout=10) == b"\x00\x01" * 40_000


def test_a_hundred_requests_at_once(preview: Preview) -> None:
    def one(index: int) -> bytes:
        body = str(index).encode() * 100
        answer = preview.alice.post(f"{preview.base}/echo", content=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["sha256"] == hashlib.sha256(body).hexdigest()
        return body

    with ThreadPoolExecutor(100) as pool:
        assert len(list(pool.map(one, range(100)))) == 100


def test_a_preview_token_grants_its_port_until_it_expires(preview: Preview) -> None:
    minted = preview.alice.post(f"{preview.base}/tokens", json={"ttl": 60})
    assert minted.status_code == 201, minted.text
    token = minted.json()
    with preview.anonymous() as browser:
        assert browser.get(f"{preview.base}/health").status_code == 401
        first = browser.get(f"{preview.base}/health", params={"preview_token": token["token"]})
        assert first.status_code == 200
        assert browser.get(f"{preview.base}/health").status_code == 200  # the cookie the first visit set
        other_port = f"/v1/sandboxes/{preview.sandbox_id}/ports/{APP_PORT + 1}/health"
        assert browser.get(other_port, headers={"X-Preview-Token": token["token"]}).status_code == 401
        preview.clock.advance(61)
        assert browser.get(f"{preview.base}/health").status_code == 401


def test_a_revoked_preview_token_grants_nothing(preview: Preview) -> None:
    token = preview.alice.post(f"{preview.base}/tokens", json={}).json()
    headers = {"X-Preview-Token": token["token"]}
    with preview.anonymous() as browser:
        assert browser.get(f"{preview.base}/health", headers=headers).status_code == 200
        assert preview.alice.delete(f"{preview.base}/tokens/{token['token_id']}").status_code == 204
        refused = browser.get(f"{preview.base}/health", headers=headers)
    assert refused.status_code == 401
    assert refused.json()["error"] == "unauthorized"


def test_a_port_is_public_only_once_made_so(preview: Preview) -> None:
    with preview.anonymous() as stranger:
        assert stranger.get(f"{preview.base}/health").status_code == 401
        assert stranger.put(preview.base, json={"public": True}).status_code == 401  # the key's alone
        assert stranger.post(f"{preview.base}/tokens", json={}).status_code == 401
        made = preview.alice.put(preview.base, json={"public": True})
        assert made.json() == {"sandbox_id": preview.sandbox_id, "port": APP_PORT, "public": True}
        assert stranger.get(f"{preview.base}/health").status_code == 200
        assert preview.alice.put(preview.base, json={"public": False}).status_code == 200
        assert stranger.get(f"{preview.base}/health").status_code == 401


def test_another_tenant_gets_404(preview: Preview) -> None:
    with preview.service.client("bob") as bob:
        answer = bob.get(f"{preview.base}/health")
        assert answer.status_code == 404
        assert answer.json()["error"] == "not_found"
        assert bob.post(f"{preview.base}/tokens", json={}).status_code == 404
        assert bob.put(preview.base, json={"public": True}).status_code == 404


def test_the_wildcard_domain_routes_by_host(preview: Preview) -> None:
    host = f"{APP_PORT}-{preview.sandbox_id}.{DOMAIN}"
    answer = preview.alice.get("/health", headers={"Host": host})
    assert answer.status_code == 200
    assert answer.text == "ok"
    seen = preview.alice.get("/headers", headers={"Host": host}).json()
    assert {key.lower(): value for key, value in seen.items()}["host"] == host


def test_a_port_nothing_listens_on_is_a_502(preview: Preview) -> None:
    answer = preview.alice.get(f"/v1/sandboxes/{preview.sandbox_id}/ports/{APP_PORT + 1}/")
    assert answer.status_code == 502
    assert "nothing listens" in answer.json()["message"]


def test_the_tcp_tunnel_carries_bytes_both_ways(preview: Preview) -> None:
    url = preview.service.url.replace("http://", "ws://") + f"{preview.base}/connect"
    with ws_connect(url, additional_headers={"Authorization": f"Bearer {KEYS['alice']}"}) as tunnel:
        tunnel.send(b"GET /health HTTP/1.0\r\n\r\n")
        got = b""
        while not got.endswith(b"ok"):
            got += tunnel.recv(timeout=10)
    assert got.startswith(b"HTTP/1.1 200")
    with pytest.raises(InvalidStatus) as refused:  # no key, no tunnel: a token is for browsers
        ws_connect(url).close()
    assert refused.value.response.status_code == 401


def test_a_forwarded_port_carries_real_http_requests(preview: Preview) -> None:
    with SandboxClient(preview.service.url, KEYS["alice"]) as client:
        sandbox = client.attach(preview.sandbox_id)
        with sandbox.forward_port(APP_PORT, 0) as forward, httpx.Client(timeout=30) as local:
            url = f"http://127.0.0.1:{forward.local_port}"
            assert local.get(f"{url}/health").text == "ok"
            big = local.get(f"{url}/big", params={"n": 3 << 20})
            assert len(big.content) == 3 << 20
            body = b"z" * 500_000
            assert local.post(f"{url}/echo", content=body).json()["length"] == len(body)

        async def over_a_loop() -> bytes:
            async with await sandbox.aconnect_port(APP_PORT) as conn:
                await conn.send(b"GET /health HTTP/1.0\r\n\r\n")
                parts = []
                while chunk := await conn.recv():
                    parts.append(chunk)
            return b"".join(parts)

        assert asyncio.run(over_a_loop()).endswith(b"\r\n\r\nok")
        with pytest.raises(PortUnreachable) as refused:
            sandbox.connect_port(APP_PORT + 1)
        assert refused.value.status == 502


def test_the_cli_forwards_a_port_until_interrupted(preview: Preview) -> None:
    env = {**os.environ, "SANDBOXES_URL": preview.service.url, "SANDBOXES_API_KEY": KEYS["alice"]}
    argv = [sys.executable, "-m", "sandboxes.cli", "ports", "forward", preview.sandbox_id, str(APP_PORT)]
    process = subprocess.Popen([*argv, "--local-port", "0"], stdout=subprocess.PIPE, env=env)
    try:
        assert process.stdout is not None
        ready = select.select([process.stdout], [], [], 30)[0]
        assert ready, "the forward never said where it listens"
        line = process.stdout.readline().decode()
        assert line.startswith("Forwarding from 127.0.0.1:"), line
        local_port = int(line.split(":")[1].split()[0])
        answer = httpx.get(f"http://127.0.0.1:{local_port}/health", timeout=30)
        assert answer.text == "ok"
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 130


def test_token_and_public_requests_take_from_a_bucket_apart_from_the_tenants_api(preview: Preview) -> None:
    """Strangers on a shared link cannot spend the tenant's own API rate."""
    buckets = preview.service.app.state.service.limiter._buckets
    buckets.pop("alice (previews)", None)
    token = preview.alice.post(f"{preview.base}/tokens", json={}).json()["token"]
    with preview.anonymous() as browser:
        assert browser.get(f"{preview.base}/health", headers={"X-Preview-Token": token}).status_code == 200
    assert "alice (previews)" in buckets
