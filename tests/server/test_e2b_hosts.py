"""E2B without ``E2B_SANDBOX_URL`` (`sandboxes.server.e2b.hosts`): on a service with a wildcard
``preview_domain``, the E2B answers name that domain, and a request whose ``Host`` is
``{port}-{id}.{domain}`` is served by the envd plane as ``/e2b/envd`` with that sandbox and port
in E2B's headers is (envd's port 49983, the code interpreter's 49999, any other with the
sandbox's traffic token or public traffic); the preview rules still hold for the rest. httpx on
loopback with the ``Host`` header, and the unmodified E2B SDK through a FAKE wildcard DNS and TLS
ingress (`e2b_ingress`) with neither ``E2B_SANDBOX_URL`` nor ``E2B_DOMAIN``. On a local jail, a
web app INSIDE the sandbox stands in for the code interpreter's server."""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b_code_interpreter import Sandbox as CodeSandbox
from e2b_harness import service_fixture
from e2b_ingress import ingress
from service_harness import KEYS, Running, start_process

DOMAIN = "sandboxes.test"
JUPYTER_PORT = 49999
APP = (Path(__file__).parent / "preview_app.py").read_text()

service = service_fixture("e2b-hosts", ("local",), preview_domain=DOMAIN)


def _e2b(service: Running) -> httpx.Client:
    return httpx.Client(base_url=f"{service.url}/e2b", headers={"X-API-KEY": KEYS["alice"]}, timeout=60)


def _host(sandbox_id: str, port: int) -> dict[str, str]:
    return {"Host": f"{port}-{sandbox_id}.{DOMAIN}"}


def _started(service: Running, **body: Any) -> dict[str, Any]:
    """A sandbox made through E2B's create, ``preview_app.py`` running INSIDE it on port 49999
    (written through ``/e2b/envd``, started through the service's own API)."""
    with _e2b(service) as e2b:
        created = e2b.post("/sandboxes", json={"templateID": "base", "timeout": 3600, **body})
    assert created.status_code == 201, created.text
    answer: dict[str, Any] = created.json()
    sandbox_id, token = answer["sandboxID"], answer["envdAccessToken"]
    written = httpx.post(
        f"{service.url}/e2b/envd/files",
        params={"path": "app.py"},
        files={"file": ("app.py", APP.encode())},
        headers={"E2b-Sandbox-Id": sandbox_id, "X-Access-Token": token},
    )
    assert written.status_code == 200, written.text
    with service.client("alice") as alice:
        start_process(alice, sandbox_id, f"exec python3 app.py {JUPYTER_PORT}")
    _wait_listening(service, sandbox_id, token)
    return answer


def _wait_listening(service: Running, sandbox_id: str, token: str) -> None:
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(JUPYTER_PORT), "X-Access-Token": token}
    deadline = time.monotonic() + 30
    while (answer := httpx.get(f"{service.url}/e2b/envd/health", headers=headers)).status_code != 200:
        assert answer.status_code == 502, answer.text  # nothing listens yet
        assert time.monotonic() < deadline, "the app in the sandbox never listened"
        time.sleep(0.05)
    assert answer.text == "ok"


@pytest.fixture(scope="module")
def sandbox(service: Running) -> Iterator[dict[str, Any]]:
    created = _started(service)
    yield created
    with _e2b(service) as e2b:
        e2b.delete(f"/sandboxes/{created['sandboxID']}")


def test_create_connect_get_and_list_answer_the_preview_domain(service: Running, sandbox: dict[str, Any]) -> None:
    assert sandbox["domain"] == DOMAIN
    sandbox_id = sandbox["sandboxID"]
    with _e2b(service) as e2b:
        assert e2b.post(f"/sandboxes/{sandbox_id}/connect", json={"timeout": 3600}).json()["domain"] == DOMAIN
        assert e2b.get(f"/sandboxes/{sandbox_id}").json()["domain"] == DOMAIN
        listed = {item["sandboxID"]: item for item in e2b.get("/v2/sandboxes").json()}
    assert listed[sandbox_id]["domain"] == DOMAIN


def test_the_envd_host_is_the_envd_plane(service: Running, sandbox: dict[str, Any]) -> None:
    sandbox_id, token = sandbox["sandboxID"], sandbox["envdAccessToken"]
    by_host = {**_host(sandbox_id, 49983), "X-Access-Token": token}
    by_path = {"E2b-Sandbox-Id": sandbox_id, "X-Access-Token": token}
    assert httpx.get(f"{service.url}/health", headers=by_host).status_code == 204
    read = httpx.get(f"{service.url}/files", params={"path": "app.py"}, headers=by_host)
    assert read.status_code == 200
    assert read.content == APP.encode()
    assert (
        read.content == httpx.get(f"{service.url}/e2b/envd/files", params={"path": "app.py"}, headers=by_path).content
    )
    listed = httpx.post(  # a Connect RPC, at the path the SDK's envd client names
        f"{service.url}/filesystem.Filesystem/ListDir",
        json={"path": ".", "depth": 1},
        headers={**by_host, "Connect-Protocol-Version": "1"},
    )
    assert listed.status_code == 200, listed.text
    assert "app.py" in {entry["name"] for entry in listed.json()["entries"]}


def test_the_envd_host_refuses_as_the_envd_plane_does(service: Running, sandbox: dict[str, Any]) -> None:
    sandbox_id = sandbox["sandboxID"]
    for credentials in ({}, {"X-Access-Token": "not.the-token"}):
        by_host = httpx.get(f"{service.url}/health", headers={**_host(sandbox_id, 49983), **credentials})
        by_path = httpx.get(f"{service.url}/e2b/envd/health", headers={"E2b-Sandbox-Id": sandbox_id, **credentials})
        assert by_host.status_code == by_path.status_code == 401
        assert by_host.json() == by_path.json() == {"code": 401, "message": by_path.json()["message"]}


def test_the_host_names_the_sandbox_whatever_the_headers_say(service: Running, sandbox: dict[str, Any]) -> None:
    sandbox_id, token = sandbox["sandboxID"], sandbox["envdAccessToken"]
    elsewhere = {"E2b-Sandbox-Id": "another", "E2b-Sandbox-Port": "8000", "X-Access-Token": token}
    assert httpx.get(f"{service.url}/health", headers={**elsewhere, **_host(sandbox_id, 49983)}).status_code == 204


def test_the_code_interpreters_host_takes_the_traffic_token_and_the_preview_rules(
    service: Running, sandbox: dict[str, Any]
) -> None:
    sandbox_id, token = sandbox["sandboxID"], sandbox["trafficAccessToken"]
    host = _host(sandbox_id, JUPYTER_PORT)
    with httpx.stream(
        "POST",
        f"{service.url}/execute",
        json={"code": "1+1"},
        headers={**host, "E2B-Traffic-Access-Token": token},
    ) as executed:
        assert executed.status_code == 200
        lines = [json.loads(line) for line in executed.iter_lines() if line]
    assert [line["text"] for line in lines if line["type"] == "result"] == ["2"]
    wrong = httpx.get(f"{service.url}/health", headers={**host, "E2B-Traffic-Access-Token": "not.the-token"})
    assert wrong.status_code == 401
    assert wrong.json()["code"] == 401  # E2B's shape: its plane answered
    stranger = httpx.get(f"{service.url}/health", headers=host)
    assert stranger.status_code == 401
    assert stranger.json()["error"] == "unauthorized"  # the preview's: no token, no key, not public
    keyed = httpx.get(f"{service.url}/health", headers={**host, "Authorization": f"Bearer {KEYS['alice']}"})
    assert keyed.text == "ok"  # the tenant's key, as on any preview host
    seen = httpx.get(f"{service.url}/headers", headers={**host, "E2B-Traffic-Access-Token": token}).json()
    lowered = {key.lower(): value for key, value in seen.items()}
    assert lowered["host"] == host["Host"]
    assert "e2b-traffic-access-token" not in lowered  # the token never reaches the sandbox


def test_public_traffic_opens_the_ports_hosts_without_a_token(service: Running) -> None:
    network = {"allowPublicTraffic": True, "maskRequestHost": "localhost:${PORT}"}
    public = _started(service, network=network)
    try:
        seen = httpx.get(f"{service.url}/headers", headers=_host(public["sandboxID"], JUPYTER_PORT))
        assert seen.status_code == 200, seen.text
        assert {key.lower(): value for key, value in seen.json().items()}["host"] == f"localhost:{JUPYTER_PORT}"
    finally:
        with _e2b(service) as e2b:
            e2b.delete(f"/sandboxes/{public['sandboxID']}")


def test_the_sdk_without_a_sandbox_url_reaches_the_sandbox_by_its_hosts(
    service: Running, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("E2B_SANDBOX_URL", "E2B_DOMAIN", "E2B_DEBUG", "E2B_API_URL"):
        monkeypatch.delenv(name, raising=False)
    port = int(service.url.rsplit(":", 1)[1])
    with ingress(DOMAIN, port, tmp_path) as front:
        monkeypatch.setenv("SSL_CERT_FILE", str(front.ca_file))  # the SDK's TLS trusts the ingress's CA
        options = {"api_key": KEYS["alice"], "api_url": f"https://api.{DOMAIN}/e2b", "proxy": front.url}
        sandbox = CodeSandbox.create(template="base", timeout=3600, **options)
        try:
            assert sandbox.sandbox_domain == DOMAIN
            sandbox.files.write("app.py", APP)
            assert sandbox.commands.run("echo envd").stdout == "envd\n"
            sandbox.commands.run(f"exec python3 app.py {JUPYTER_PORT}", background=True)
            token = sandbox.traffic_access_token or ""
            assert sandbox.get_host(JUPYTER_PORT) == f"{JUPYTER_PORT}-{sandbox.sandbox_id}.{DOMAIN}"
            _wait_listening(service, sandbox.sandbox_id, token)
            execution = sandbox.run_code("1+1")
            assert execution.text == "2"
            trusted = ssl.create_default_context(cafile=str(front.ca_file))
            with httpx.Client(proxy=front.url, verify=trusted) as browser:  # what a user's own client sees
                assert browser.get(sandbox.download_url("app.py")).text == APP  # signed: no token sent
                own = browser.get(f"https://{sandbox.get_host(JUPYTER_PORT)}/health")
                assert own.status_code == 401  # not public: the token, a key or a preview token
                own = browser.get(own.url, headers={"E2B-Traffic-Access-Token": token})
                assert own.text == "ok"
            again = CodeSandbox.connect(sandbox.sandbox_id, **options)
            assert again.files.read("app.py") == APP
        finally:
            sandbox.kill()
        envd, jupyter = f"49983-{sandbox.sandbox_id}.{DOMAIN}:443", f"{JUPYTER_PORT}-{sandbox.sandbox_id}.{DOMAIN}:443"
        assert {envd, jupyter, f"api.{DOMAIN}:443"} <= set(front.hosts)
