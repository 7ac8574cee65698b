"""Over real HTTP: authentication, tenant isolation on every route, quotas, rate limits, body
limits, and what a sandbox can (not) see of the service."""

from __future__ import annotations

import contextlib
import io
import json
import re
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import KEYS, Running, create, error_of, execute, running, settings_for
from starlette.routing import WebSocketRoute
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from sandboxes.api import FILE_OPERATIONS


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    data_dir = tmp_path_factory.mktemp("security")
    settings = settings_for(data_dir, max_body_bytes=64 * 1024, max_archive_bytes=256 * 1024)
    with running(settings) as svc:
        yield svc


@pytest.fixture
def alice(service: Running) -> Iterator[httpx.Client]:
    with service.client("alice") as client:
        yield client


@pytest.fixture
def bob(service: Running) -> Iterator[httpx.Client]:
    with service.client("bob") as client:
        yield client


def _tar(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


# ---------------------------------------------------------------------- authentication


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-key"},
        {"Authorization": f"Basic {KEYS['alice']}"},
        {"Authorization": "Bearer"},
        {"Authorization": KEYS["alice"]},
    ],
    ids=["no-key", "wrong-key", "wrong-scheme", "empty-key", "no-scheme"],
)
def test_requests_without_a_valid_key_are_401(service: Running, headers: dict[str, str]) -> None:
    with httpx.Client(base_url=service.url, headers=headers) as client:
        for method, path in [("GET", "/v1/sandboxes"), ("POST", "/v1/sandboxes"), ("GET", "/v1/sandboxes/x")]:
            response = client.request(method, path, json={} if method == "POST" else None)
            assert response.status_code == 401, (method, path, response.text)
            assert error_of(response) == "unauthorized"
            assert response.headers["www-authenticate"] == "Bearer"


def test_health_needs_no_key_metrics_do(service: Running, alice: httpx.Client) -> None:
    with service.client(None) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/readyz").json() == {"status": "ready"}
        assert client.get("/v1/openapi.json").json()["info"]["title"] == "sandboxes"
        refused = client.get("/metrics")
        assert (refused.status_code, error_of(refused)) == (401, "unauthorized")
        assert "sandboxes_live" not in refused.text
    assert "sandboxes_live" in alice.get("/metrics").text


def test_metrics_can_be_configured_open(tmp_path: Path) -> None:
    with running(settings_for(tmp_path, metrics_access="open")) as svc, svc.client(None) as client:
        assert "sandboxes_live" in client.get("/metrics").text
        assert client.get("/v1/sandboxes").status_code == 401


def test_no_docs_page_that_needs_a_cdn(alice: httpx.Client) -> None:
    assert alice.get("/v1/docs").status_code == 404
    assert alice.get("/v1/openapi.json").status_code == 200


# ---------------------------------------------------------------------- strangers


def _raw_exchange(service: Running, head: bytes, body: bytes = b"", wait: float = 5.0) -> bytes:
    """Send ``head`` and ``body`` on a fresh connection and return what comes back within
    ``wait`` seconds (the connection may be closed before everything is sent)."""
    host, port = service.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as sock:
        with contextlib.suppress(OSError):  # refused and closed mid-send
            sock.sendall(head)
            sock.sendall(body)
        answer = b""
        with contextlib.suppress(OSError):  # a timeout: no (more) answer
            while chunk := sock.recv(65536):
                answer += chunk
                if b"\r\n\r\n" in answer and b"content-length" in answer.lower():
                    length = int(answer.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                    if len(answer.split(b"\r\n\r\n", 1)[1]) >= length:
                        break
        return answer


def test_a_stranger_is_refused_before_its_body_is_read(service: Running, alice: httpx.Client) -> None:
    """Declares 60 KB (under the body limit) and sends 1 KB: the 401 must come without the rest."""
    sandbox = create(alice)
    try:
        head = (
            f"POST /v1/sandboxes/{sandbox['id']}/execute HTTP/1.1\r\nHost: x\r\n"
            "Content-Type: application/json\r\nContent-Length: 60000\r\n\r\n"
        ).encode()
        started = time.monotonic()
        answer = _raw_exchange(service, head, b'{"command": "' + b"x" * 1000)
        assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
        assert time.monotonic() - started < 4
    finally:
        alice.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_an_oversized_request_head_is_refused(service: Running, alice: httpx.Client) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (4 << 20) + b"\r\n\r\n"
    answer = _raw_exchange(service, head)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"too_large" in answer
    # an ordinary head still passes, on a fresh connection
    assert alice.get("/healthz", headers={"X-Fine": "a" * 4000}).status_code == 200


# ---------------------------------------------------------------------- bad input, plain answers

DEEP = b"[" * 20_000 + b"]" * 20_000


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/files/read", b'{"file_path": "/tmp/\\ud800"}'),
        ("/files/write", b'{"file_path": "/tmp/x", "content": "\\udfff"}'),
        ("/execute", b'{"command": "echo \\ud800"}'),
        ("/execute", b'{"command": ' + DEEP + b"}"),
        ("/files/ls", b'{"path": ' + DEEP + b"}"),
        ("/processes", b'{"command": ' + DEEP + b"}"),
    ],
    ids=["read-surrogate", "write-surrogate", "execute-surrogate", "execute-deep", "ls-deep", "process-deep"],
)
def test_unparseable_bodies_are_422_without_internals(alice: httpx.Client, route: str, body: bytes) -> None:
    sandbox = create(alice)
    try:
        for path in (f"/v1/sandboxes/{sandbox['id']}{route}", f"/v1/sandboxes/unknown{route}"):
            response = alice.post(path, content=body, headers={"Content-Type": "application/json"})
            assert (response.status_code, error_of(response)) == (422, "invalid_request"), response.text
            assert "Error" not in response.text
            assert "codec" not in response.text
    finally:
        alice.delete(f"/v1/sandboxes/{sandbox['id']}")
    deep_create = alice.post(
        "/v1/sandboxes", content=b'{"template": ' + DEEP + b"}", headers={"Content-Type": "application/json"}
    )
    assert (deep_create.status_code, error_of(deep_create)) == (422, "invalid_request")


def test_archive_errors_do_not_show_tar_internals(alice: httpx.Client) -> None:
    sandbox = create(alice)
    try:
        url = f"/v1/sandboxes/{sandbox['id']}/archive"
        garbage = alice.put(url, params={"path": sandbox["workdir"]}, content=b"\x1f\x8b" + b"junk" * 200)
        assert (garbage.status_code, error_of(garbage)) == (422, "invalid_request")
        assert garbage.json()["message"] == "not a readable tar stream (truncated or corrupt)"
        cut = alice.put(url, params={"path": sandbox["workdir"]}, content=_tar({"f": b"z" * 5000})[:1500])
        assert (cut.status_code, error_of(cut)) == (422, "invalid_request")
        assert cut.json()["message"] == "not a readable tar stream (truncated or corrupt)"
    finally:
        alice.delete(f"/v1/sandboxes/{sandbox['id']}")


# ---------------------------------------------------------------------- tenancy


def _served_routes(routes: Any) -> Iterator[tuple[str, str]]:
    """(method, path template) of every route the app serves, through included routers
    (FastAPI's newer ``_IncludedRouter`` exposes its routes as ``effective_candidates()``)."""
    for route in routes:
        candidates = getattr(route, "effective_candidates", None)
        if candidates is not None:
            yield from _served_routes(candidates())
            continue
        path, methods = getattr(route, "path", None), getattr(route, "methods", None)
        if isinstance(route, WebSocketRoute):  # a WebSocket's handshake: checked as one below
            methods = {_WEBSOCKET}
        assert path, f"a route this test cannot read, so cannot check: {route!r}"
        assert methods, f"a route this test cannot read, so cannot check: {route!r}"
        for method in sorted(methods - {"HEAD"}):
            yield method, re.sub(r"\{(\w+):\w+\}", r"{\1}", path)  # {port:int} as {port}


_WEBSOCKET = "WEBSOCKET"


_NO_SANDBOX_IN_PATH = {
    ("POST", "/v1/sandboxes"): "creates a sandbox of the caller's own: there is no other tenant's to name",
    ("GET", "/v1/sandboxes"): "lists the caller's own: checked below, bob's list stays empty",
    ("GET", "/v1/openapi.json"): "the API's schema, the same for every tenant",
    ("GET", "/healthz"): "liveness, no tenant data",
    ("GET", "/readyz"): "readiness, no tenant data",
    ("GET", "/metrics"): "aggregate counters, no sandbox ids (an operator's, see test_health_needs_no_key_metrics_do)",
    ("GET", "/v1/templates"): "the service's templates, the same for every tenant",
    ("POST", "/v1/volumes"): "creates a volume of the caller's own (other tenants' volumes: test_service_volumes.py)",
    ("GET", "/v1/volumes"): "lists the caller's own volumes (test_service_volumes.py checks bob sees none of alice's)",
    ("DELETE", "/v1/volumes/{name}"): "names a volume of the caller's own (test_service_volumes.py: bob cannot delete)",
    ("GET", "/v1/snapshots"): "lists the caller's own snapshots (test_service_snapshots.py: bob's stays empty)",
    ("GET", "/v1/snapshots/{snapshot_id}"): "a snapshot is its tenant's: test_service_snapshots.py, 404 to another",
    ("DELETE", "/v1/snapshots/{snapshot_id}"): "a snapshot is its tenant's: found as the GET finds it (get first)",
    ("GET", "/v1/operator/overview"): "every tenant's usage, an operator key's only: others get 403 (test_operator.py)",
    ("GET", "/files"): "E2B's signed URLs: only the sandbox's own token makes the signature (test_e2b_peer.py: 401)",
    ("POST", "/files"): "E2B's signed upload URLs: as GET /files, the signature names the sandbox",
}
"""Routes that name no sandbox, so have no other tenant's sandbox to refuse: each with why."""


_SANDBOX = "/v1/sandboxes/{sandbox_id}"


def _requests(workdir: str) -> dict[tuple[str, str], tuple[dict[str, str], Any]]:
    """(method, path after the sandbox's) -> query parameters and body of a request a tenant
    could legitimately send there: a refusal must come from tenancy, not from a malformed request."""
    secret = f"{workdir}/secret.txt"
    files: dict[str, Any] = {
        "ls": {"path": workdir},
        "read": {"file_path": secret},
        "write": {"file_path": secret, "content": "stolen"},
        "edit": {"file_path": secret, "old_string": "alice", "new_string": "bob"},
        "delete": {"file_path": secret},
        "grep": {"pattern": "alice", "path": workdir},
        "glob": {"pattern": "*", "path": workdir},
        "upload": {"files": [{"path": f"{workdir}/x", "content_b64": "eA=="}]},
        "download": {"paths": [secret]},
    }
    assert set(files) == set(FILE_OPERATIONS)
    return {
        ("GET", ""): ({}, None),
        ("DELETE", ""): ({}, None),
        ("POST", "/renew"): ({}, {"ttl": 100}),
        ("POST", "/execute"): ({}, {"command": "echo hi"}),
        ("POST", "/execute/stream"): ({}, {"command": "echo hi"}),
        ("GET", "/execute/{command_id}/stream"): ({}, None),
        ("DELETE", "/execute/{command_id}"): ({}, None),
        ("POST", "/processes"): ({}, {"command": "echo hi"}),
        ("GET", "/processes/{process_id}"): ({}, None),
        ("DELETE", "/processes/{process_id}"): ({}, None),
        **{("POST", f"/files/{op}"): ({}, body) for op, body in files.items()},
        ("GET", "/watch"): ({"path": workdir}, None),
        ("POST", "/watchers"): ({}, {"path": workdir}),
        ("GET", "/watchers/{watcher_id}/events"): ({}, None),
        ("DELETE", "/watchers/{watcher_id}"): ({}, None),
        ("GET", "/metrics"): ({}, None),
        ("GET", "/egress"): ({}, None),
        ("PUT", "/egress"): ({}, {"allow": ["example.com"]}),
        ("GET", "/archive"): ({"path": workdir}, None),
        ("PUT", "/archive"): ({"path": workdir}, _tar({"x": b"x"})),
        ("POST", "/pause"): ({}, {}),
        ("POST", "/resume"): ({}, None),
        ("POST", "/snapshots"): ({}, {}),
        ("POST", "/fork"): ({}, {"count": 1}),
        ("PUT", "/ports/{port}"): ({}, {"public": True}),
        ("POST", "/ports/{port}/tokens"): ({}, {}),
        ("DELETE", "/ports/{port}/tokens/{token_id}"): ({}, None),
        **{
            (method, "/ports/{port}/{path}"): ({}, None)
            for method in ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
        },
        (_WEBSOCKET, "/ports/{port}/{path}"): ({}, None),
        (_WEBSOCKET, "/ports/{port}/connect"): ({}, None),
        (_WEBSOCKET, "/pty"): ({}, None),
    }


def test_another_tenants_sandbox_is_not_found_on_every_route(
    service: Running, alice: httpx.Client, bob: httpx.Client
) -> None:
    """Every route the app serves, read from the app itself: one that names a sandbox answers
    404 to another tenant and for an unknown id; any other is exempt only with a reason."""
    # The E2B-compatible API authenticates on its own terms: test_e2b_sdk.py checks each of its routes.
    routes = sorted(route for route in set(_served_routes(service.app.routes)) if not route[1].startswith("/e2b/"))
    unexplained = [route for route in routes if "{sandbox_id}" not in route[1] and route not in _NO_SANDBOX_IN_PATH]
    assert not unexplained, f"routes neither checked for tenancy nor exempt (with a reason): {unexplained}"
    served = {(method, path.removeprefix(_SANDBOX)) for method, path in routes if path.startswith(_SANDBOX)}
    assert not {path for _, path in routes if "{sandbox_id}" in path and not path.startswith(_SANDBOX)}
    untested = served - set(_requests("/any"))
    assert not untested, f"routes that name a sandbox but have no request in _requests, so no tenancy check: {untested}"
    assert not set(_requests("/any")) - served, "_requests names routes the app does not serve"
    sandbox = create(alice)
    sandbox_id, workdir = sandbox["id"], sandbox["workdir"]
    alice.post(
        f"/v1/sandboxes/{sandbox_id}/files/write", json={"file_path": f"{workdir}/secret.txt", "content": "alice"}
    )
    process = alice.post(f"/v1/sandboxes/{sandbox_id}/processes", json={"command": "sleep 30"}).json()
    with alice.stream("POST", f"/v1/sandboxes/{sandbox_id}/execute/stream", json={"command": "echo hi"}) as streamed:
        command_id = json.loads(next(streamed.iter_lines()))["id"]
    watcher_id = alice.post(f"/v1/sandboxes/{sandbox_id}/watchers", json={"path": workdir}).json()["id"]
    try:
        # DELETE of the sandbox last: were it to succeed for bob, every later check would be moot
        requests = _requests(workdir)
        for method, suffix in sorted(served, key=lambda route: route == ("DELETE", "")):
            params, body = requests[(method, suffix)]
            kwargs: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
            for client, named in ((bob, sandbox_id), (alice, "0" * 16)):
                path = (_SANDBOX + suffix).format(
                    sandbox_id=named,
                    process_id=process["id"],
                    command_id=command_id,
                    watcher_id=watcher_id,
                    port=8000,
                    path="x",
                    token_id="0" * 24,  # a token id as minted: a malformed one is refused (422) before any lookup
                )
                if method == _WEBSOCKET:
                    _assert_websocket_not_found(service, client, path)
                    continue
                response = client.request(method, path, params=params, **kwargs)
                assert response.status_code == 404, (client.headers["authorization"], method, path, response.text)
                assert error_of(response) == "not_found"
        assert bob.get("/v1/sandboxes").json() == {"sandboxes": []}
        # nothing bob tried had any effect
        assert [s["id"] for s in alice.get("/v1/sandboxes").json()["sandboxes"]] == [sandbox_id]
        read = alice.post(f"/v1/sandboxes/{sandbox_id}/files/read", json={"file_path": f"{workdir}/secret.txt"})
        assert read.json()["file_data"]["content"] == "alice"
        poll = alice.get(f"/v1/sandboxes/{sandbox_id}/processes/{process['id']}").json()
        assert poll["status"] == "running"
        assert alice.get(f"/v1/sandboxes/{sandbox_id}/watchers/{watcher_id}/events").status_code == 200
    finally:
        alice.delete(f"/v1/sandboxes/{sandbox_id}/processes/{process['id']}")
        assert alice.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204


def _assert_websocket_not_found(service: Running, client: httpx.Client, path: str) -> None:
    url = service.url.replace("http://", "ws://") + path
    with pytest.raises(InvalidStatus) as refused:
        ws_connect(url, additional_headers={"Authorization": client.headers["authorization"]}).close()
    assert refused.value.response.status_code == 404, (client.headers["authorization"], path)


# ---------------------------------------------------------------------- quotas and rates


def test_quota_of_live_sandboxes(service: Running) -> None:
    with service.client("tiny") as tiny:
        first = create(tiny)
        refused = tiny.post("/v1/sandboxes", json={})
        assert refused.status_code == 429  # its sandbox's expiry frees the quota: waiting helps
        assert error_of(refused) == "quota_exceeded"
        assert "1 live sandboxes" in refused.json()["message"]
        assert int(refused.headers["retry-after"]) >= 1
        assert tiny.delete(f"/v1/sandboxes/{first['id']}").status_code == 204
        second = create(tiny)  # freed by the delete
        tiny.delete(f"/v1/sandboxes/{second['id']}")


def test_quota_of_cpus_and_memory(service: Running) -> None:
    with service.client("tiny") as tiny:
        refused = tiny.post("/v1/sandboxes", json={"template": "big"})  # 4 cpus > 1.5
        assert refused.status_code == 403  # not even alone: no waiting helps
        assert error_of(refused) == "quota_exceeded"
        assert "cpus" in refused.json()["message"]
        assert tiny.get("/v1/sandboxes").json() == {"sandboxes": []}


def test_rate_limit_refuses_with_retry_after(service: Running) -> None:
    with service.client("slow") as slow:
        statuses = [slow.get("/v1/sandboxes").status_code for _ in range(6)]
        assert statuses[:3] == [200, 200, 200]  # the burst
        assert 429 in statuses[3:]
        refused = slow.get("/v1/sandboxes")
        assert refused.status_code == 429
        assert error_of(refused) == "rate_limited"
        assert int(refused.headers["retry-after"]) >= 1  # the refill: tests/server/test_rate_limiter.py


def test_rate_limits_are_per_tenant(service: Running, alice: httpx.Client) -> None:
    with service.client("slow") as slow:
        for _ in range(6):
            slow.get("/v1/sandboxes")
        assert slow.get("/v1/sandboxes").status_code == 429
    assert all(alice.get("/v1/sandboxes").status_code == 200 for _ in range(10))


# ---------------------------------------------------------------------- body limits and bad input


def test_oversized_json_body_is_413(alice: httpx.Client) -> None:
    sandbox = create(alice)
    try:
        path = f"/v1/sandboxes/{sandbox['id']}/files/write"
        big = {"file_path": f"{sandbox['workdir']}/big", "content": "x" * 100_000}
        response = alice.post(path, json=big)
        assert response.status_code == 413
        assert error_of(response) == "too_large"

        def chunked() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
            yield b'{"file_path": "' + sandbox["workdir"].encode() + b'/big", "content": "'
            for _ in range(20):
                yield b"y" * 10_000
            yield b'"}'

        response = alice.post(path, content=chunked(), headers={"Content-Type": "application/json"})
        assert response.status_code == 413
        assert error_of(response) == "too_large"
        small = alice.post(path, json={"file_path": f"{sandbox['workdir']}/small", "content": "x" * 1000})
        assert small.json()["error"] is None
    finally:
        alice.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_oversized_archive_is_413(alice: httpx.Client) -> None:
    sandbox = create(alice)
    try:
        url = f"/v1/sandboxes/{sandbox['id']}/archive"
        archive = _tar({"big.bin": b"z" * 300_000})
        response = alice.put(url, params={"path": sandbox["workdir"]}, content=archive)
        assert response.status_code == 413
        assert error_of(response) == "too_large"
        response = alice.put(url, params={"path": sandbox["workdir"]}, content=iter([archive]))  # chunked
        assert response.status_code == 413
        assert error_of(response) == "too_large"
    finally:
        alice.delete(f"/v1/sandboxes/{sandbox['id']}")


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"template": "nope"}, "unknown template"),
        ({"ttl": -1}, "ttl"),
        ({"labels": {"bad key!": "v"}}, "invalid label"),
        ({"env": {"A=B": "v"}}, "invalid environment"),
        ({"unexpected": 1}, "unexpected"),
    ],
)
def test_invalid_create_requests_are_422(alice: httpx.Client, body: dict[str, Any], fragment: str) -> None:
    response = alice.post("/v1/sandboxes", json=body)
    assert response.status_code == 422, response.text
    assert error_of(response) == "invalid_request"
    assert fragment in response.json()["message"]


def test_request_ids_are_echoed_and_in_error_bodies(alice: httpx.Client) -> None:
    response = alice.get("/v1/sandboxes/missing", headers={"X-Request-ID": "trace-123"})
    assert response.headers["x-request-id"] == "trace-123"
    assert response.json()["request_id"] == "trace-123"
    generated = alice.get("/v1/sandboxes")
    assert len(generated.headers["x-request-id"]) == 32


def test_unknown_route_is_a_json_404(alice: httpx.Client) -> None:
    response = alice.post("/v1/sandboxes/x/files/chmod", json={})
    assert response.status_code == 404
    assert error_of(response) == "not_found"


# ---------------------------------------------------------------------- what a sandbox sees


def test_a_local_sandbox_sees_no_service_secrets(service: Running, alice: httpx.Client) -> None:
    sandbox = create(alice)
    try:
        data_dir = service.app.state.service.settings.data_dir
        env = execute(alice, sandbox["id"], "env")["output"]
        # the command's own markers (process id, exec helper's command id) name nothing secret
        assert "SANDBOXES_" not in env.replace("SANDBOXES_PROCESS_ID", "").replace("SANDBOXES_EXEC_ID", "")
        assert KEYS["alice"] not in env
        state = execute(alice, sandbox["id"], f"ls {data_dir}/state; cat {data_dir}/state/*.json")
        assert state["exit_code"] != 0
        assert sandbox["id"] not in state["output"]
        assert execute(alice, sandbox["id"], "ls /var/run/docker.sock /run/docker.sock")["exit_code"] != 0
    finally:
        alice.delete(f"/v1/sandboxes/{sandbox['id']}")


# ---------------------------------------------------------------------- start-up refusals


def _serve(args: list[str], tmp_path: Path, timeout: float = 20) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sandboxes.server", "--data-dir", str(tmp_path), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )


def test_refuses_to_start_without_api_keys(tmp_path: Path) -> None:
    process = _serve(["--port", "0"], tmp_path)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 2
    assert "refusing to start without API keys" in stderr


def test_insecure_starts_without_keys_and_says_so_loudly(tmp_path: Path) -> None:
    from service_harness import free_port

    port = free_port()
    process = _serve(["--insecure", "--port", str(port)], tmp_path)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as anonymous:
            sandbox = create(anonymous)  # no key needed
            assert execute(anonymous, sandbox["id"], "echo open")["output"] == "open\n"
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    assert "INSECURE MODE" in stderr
    assert "!!!!!!!!" in stderr
