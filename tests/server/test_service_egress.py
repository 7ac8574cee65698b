"""Egress through the service, end to end, on sandboxes without a network: a command's
``HTTP_PROXY`` leads to the exec helper's listener inside the sandbox, the helper relays the
connection to the service, and the service's egress proxy checks it against the sandbox's
allow-list. On Docker and in a local jail, with Python's urllib and with ``pip download`` as the
sandbox's clients, against servers this test starts on 127.0.0.2 and 127.0.0.3 (loopback only).
The tenant's credential reaches the server and is found nowhere in the sandbox. A create may
carry its own allow-list (the API, the Python client, the E2B SDK's ``allow_internet_access`` and
``network``), which the sandbox starts with instead of its template's."""

from __future__ import annotations

import asyncio
import io
import shlex
import threading
import time
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import ALL_TRAFFIC, AsyncSandbox, Sandbox, SandboxException
from e2b_harness import opts
from service_harness import KEYS, UNTHROTTLED, Running, create, execute, running, settings_for
from support import HAS_BWRAP, SESSION_OWNER, needs

from sandboxes.client import InvalidRequest, SandboxClient
from sandboxes.docker import DockerTemplate
from sandboxes.lifecycle import SandboxRecord
from sandboxes.local import LocalTemplate
from sandboxes.server.backends import (
    EGRESS_NOT_RECORDED,
    LABEL_EGRESS_ALLOW,
    LABEL_SERVICE_EXPIRES,
    LABEL_SERVICE_ID,
    LABEL_TENANT,
    ProviderBackend,
    state_from_record,
)
from sandboxes.server.settings import EgressCredential, ServiceSettings, TenantPolicy

SECRET = "s3cret-token-never-in-the-sandbox"
CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}


def _wheel() -> bytes:
    """A minimal wheel of ``tinypkg`` 1.0, for pip to download."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        info = "tinypkg-1.0.dist-info"
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n")
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
        wheel.writestr("tinypkg/__init__.py", "")
    return buffer.getvalue()


WHEEL = _wheel()


@dataclass
class Target:
    """An HTTP server on a loopback address: a greeting, and a one-package simple index."""

    host: str
    server: ThreadingHTTPServer
    seen: list[dict[str, str]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])


def _serve(host: str) -> Iterator[Target]:
    box: list[Target] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            box[0].seen.append({k.lower(): v for k, v in self.headers.items()} | {"path": self.path})
            if self.path.startswith("/simple/tinypkg"):
                name = "tinypkg-1.0-py3-none-any.whl"
                body = f'<html><body><a href="/packages/{name}">{name}</a></body></html>'.encode()
                kind = "text/html"
            elif self.path.startswith("/packages/"):
                body, kind = WHEEL, "application/octet-stream"
            elif self.path.startswith("/bytes/"):
                body, kind = b"x" * int(self.path.rsplit("/", 1)[-1]), "application/octet-stream"
            else:
                body, kind = f"hello from {host}".encode(), "text/plain"
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer((host, 0), Handler)
    server.daemon_threads = True
    box.append(Target(host, server))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield box[0]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def allowed() -> Iterator[Target]:
    yield from _serve("127.0.0.2")


@pytest.fixture(scope="module")
def refused() -> Iterator[Target]:
    yield from _serve("127.0.0.3")


def _settings(
    kind: str, request: pytest.FixtureRequest, allowed: Target, data_dir: Path
) -> tuple[ServiceSettings, Any]:
    """An egress service's settings over ``kind`` (its template allows ``allowed``), and the
    Docker client it needs."""
    egress: dict[str, Any] = {
        "egress": True,
        "egress_allow": [f"127.0.0.2:{allowed.port}"],
        "egress_open_ranges": ["127.0.0.0/8"],
    }
    docker_client = None
    if kind == "docker":
        docker_client = request.getfixturevalue("docker_client")
        image = request.getfixturevalue("runtime_image")
        template: Any = DockerTemplate(backend="docker", image=image, memory="512m", labels=CLEANUP, **egress)
    else:
        needs(HAS_BWRAP, "bubblewrap is not installed")
        template = LocalTemplate(default_timeout=60, **egress)
    credential = EgressCredential(host="127.0.0.2", headers={"Authorization": f"Bearer {SECRET}"})
    tenants = {**UNTHROTTLED, "alice": TenantPolicy(rate=10_000, burst=10_000, egress_credentials=[credential])}
    owner = f"{SESSION_OWNER}-egress-{uuid.uuid4().hex[:6]}"
    return settings_for(data_dir, owner=owner, templates={"default": template}, tenants=tenants), docker_client


@pytest.fixture(scope="module", params=["docker", "local"])
def service(
    request: pytest.FixtureRequest, allowed: Target, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    settings, docker_client = _settings(request.param, request, allowed, tmp_path_factory.mktemp("egress"))
    with running(settings, docker_client=docker_client) as svc:
        yield svc


@pytest.fixture(scope="module")
def sandbox(service: Running) -> Iterator[str]:
    with service.client() as client:
        made = create(client)["id"]
        yield made
        client.delete(f"/v1/sandboxes/{made}")


def _fetch(url: str) -> str:
    """A command that prints what urllib (through the sandbox's proxy variables) gets at ``url``."""
    script = (
        "import sys, urllib.request, urllib.error\n"
        "try:\n"
        f"    print(urllib.request.urlopen({url!r}, timeout=20).read().decode())\n"
        "except urllib.error.HTTPError as exc:\n"
        "    print(exc.code, exc.read().decode().strip())\n"
        "    sys.exit(1)\n"
    )
    return f"python3 -c {shlex.quote(script)}"


def _run(service: Running, sandbox: str, command: str) -> dict[str, Any]:
    with service.client() as client:
        return execute(client, sandbox, command, timeout=60)


def _until_listening(service: Running, sandbox: str, allowed: Target) -> None:
    """The listener is started when the sandbox is registered; the first command may come first."""
    deadline = time.monotonic() + 30
    while True:
        answer = _run(service, sandbox, _fetch(f"http://127.0.0.2:{allowed.port}/ready"))
        if answer["exit_code"] == 0 or time.monotonic() > deadline:
            assert answer["exit_code"] == 0, answer
            return
        time.sleep(0.2)


def test_an_allowed_destination_answers_with_the_tenants_credential(
    service: Running, sandbox: str, allowed: Target
) -> None:
    _until_listening(service, sandbox, allowed)
    answer = _run(service, sandbox, _fetch(f"http://127.0.0.2:{allowed.port}/hello"))
    assert answer["output"].strip() == "hello from 127.0.0.2"
    assert allowed.seen[-1]["path"] == "/hello"
    assert allowed.seen[-1]["authorization"] == f"Bearer {SECRET}"
    half = len(SECRET) // 2  # the search's own command line must not hold the secret whole
    search = f'grep -rls -e "$(printf %s {SECRET[:half]} {SECRET[half:]})" ~ /tmp . 2>/dev/null'
    looked = _run(service, sandbox, f"env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; ps aux; {search}; true")
    assert SECRET not in looked["output"]
    assert "HTTP_PROXY=http://127.0.0.1:3128" in looked["output"]


def test_curl_goes_through_the_proxy_forwarded_and_tunnelled(service: Running, sandbox: str, allowed: Target) -> None:
    _until_listening(service, sandbox, allowed)
    url = f"http://127.0.0.2:{allowed.port}/curl"
    forwarded = _run(service, sandbox, f"curl -sS --max-time 20 {url}")
    tunnelled = _run(service, sandbox, f"curl -sS --max-time 20 --proxytunnel {url}")
    refused = _run(service, sandbox, "curl -sS --max-time 20 --proxytunnel http://169.254.169.254/latest/meta-data/")
    assert forwarded["output"] == "hello from 127.0.0.2"
    assert tunnelled["output"] == "hello from 127.0.0.2"
    assert refused["exit_code"] != 0
    assert "403" in refused["output"]


def test_pip_downloads_through_the_proxy(service: Running, sandbox: str, allowed: Target) -> None:
    _until_listening(service, sandbox, allowed)
    command = (
        f"python3 -m pip download --no-deps --disable-pip-version-check -q -d /tmp/dl "
        f"--index-url http://127.0.0.2:{allowed.port}/simple --trusted-host 127.0.0.2 tinypkg && ls /tmp/dl"
    )
    answer = _run(service, sandbox, command)
    assert answer["exit_code"] == 0, answer
    assert "tinypkg-1.0-py3-none-any.whl" in answer["output"]


def test_a_refused_destination_fails_fast_with_the_reason_and_a_change_applies_next(
    service: Running, sandbox: str, allowed: Target, refused: Target
) -> None:
    _until_listening(service, sandbox, allowed)
    reached = len(refused.seen)
    started = time.monotonic()
    answer = _run(service, sandbox, _fetch(f"http://127.0.0.3:{refused.port}/"))
    assert time.monotonic() - started < 15
    assert answer["exit_code"] == 1
    assert "403 egress refused" in answer["output"]
    assert len(refused.seen) == reached  # never connected to
    with service.client() as client:
        assert client.get(f"/v1/sandboxes/{sandbox}/egress").json() == {"allow": [f"127.0.0.2:{allowed.port}"]}
        changed = client.put(f"/v1/sandboxes/{sandbox}/egress", json={"allow": [f"127.0.0.3:{refused.port}"]})
        assert changed.status_code == 200, changed.text
        assert client.put(f"/v1/sandboxes/{sandbox}/egress", json={"allow": ["not a rule"]}).status_code == 422
    answer = _run(service, sandbox, _fetch(f"http://127.0.0.3:{refused.port}/now"))
    assert answer["output"].strip() == "hello from 127.0.0.3"
    answer = _run(service, sandbox, _fetch(f"http://127.0.0.2:{allowed.port}/"))
    assert "403" in answer["output"]
    with service.client() as client:
        client.put(f"/v1/sandboxes/{sandbox}/egress", json={"allow": [f"127.0.0.2:{allowed.port}"]})


def test_another_tenant_cannot_see_or_change_the_allow_list(service: Running, sandbox: str) -> None:
    with httpx.Client(base_url=service.url, headers={"Authorization": f"Bearer {KEYS['bob']}"}) as bob:
        assert bob.get(f"/v1/sandboxes/{sandbox}/egress").status_code == 404
        assert bob.put(f"/v1/sandboxes/{sandbox}/egress", json={"allow": ["*"]}).status_code == 404


def test_a_sandbox_without_egress_allows_nothing_and_refuses_a_list(tmp_path_factory: pytest.TempPathFactory) -> None:
    needs(HAS_BWRAP, "bubblewrap is not installed")
    settings = settings_for(tmp_path_factory.mktemp("noegress"))
    with running(settings) as svc, svc.client() as client:
        made = create(client)["id"]
        try:
            looked = client.get(f"/v1/sandboxes/{made}/egress")
            changed = client.put(f"/v1/sandboxes/{made}/egress", json={"allow": ["example.com"]})
            proxy = execute(client, made, "env | grep -ci _proxy; true")
        finally:
            client.delete(f"/v1/sandboxes/{made}")
    assert looked.json() == {"allow": []}
    assert changed.status_code == 409
    assert "no egress" in changed.text
    assert proxy["output"].strip() == "0"  # no proxy variables: nothing to reach


def _until_refused(service: Running, sandbox: str, url: str) -> dict[str, Any]:
    """The answer of a fetch of ``url`` once the proxy serves it (a refusal by the policy, not a
    listener not yet started)."""
    deadline = time.monotonic() + 30
    while True:
        answer = _run(service, sandbox, _fetch(url))
        if "403 egress refused" in answer["output"] or time.monotonic() > deadline:
            assert "403 egress refused" in answer["output"], answer
            return answer
        time.sleep(0.2)


def test_a_creates_own_allow_list_replaces_the_templates(service: Running, allowed: Target, refused: Target) -> None:
    own = [f"127.0.0.3:{refused.port}"]
    with SandboxClient(service.url, KEYS["alice"]) as client, client.create(egress_allow=own) as sandbox:
        with service.client() as raw:
            assert raw.get(f"/v1/sandboxes/{sandbox.id}/egress").json() == {"allow": own}
        _until_refused(service, sandbox.id, f"http://127.0.0.2:{allowed.port}/template")  # the template's: out
        answer = _run(service, sandbox.id, _fetch(f"http://127.0.0.3:{refused.port}/own"))
        assert answer["output"].strip() == "hello from 127.0.0.3"


def test_an_empty_allow_list_reaches_nothing(service: Running, allowed: Target) -> None:
    reached = len(allowed.seen)
    with service.client() as client:
        made = create(client, egress_allow=[])["id"]
        try:
            assert client.get(f"/v1/sandboxes/{made}/egress").json() == {"allow": []}
            _until_refused(service, made, f"http://127.0.0.2:{allowed.port}/none")
        finally:
            client.delete(f"/v1/sandboxes/{made}")
    assert len(allowed.seen) == reached


def test_e2b_allow_internet_access_false_means_no_egress_and_allow_out_is_the_list(
    service: Running, allowed: Target
) -> None:
    closed = Sandbox.create(allow_internet_access=False, **opts(service))
    network: Any = {"allow_out": [f"127.0.0.2:{allowed.port}", "*.example.com"], "deny_out": [ALL_TRAFFIC]}
    listed = Sandbox.create(network=network, **opts(service))
    default = Sandbox.create(**opts(service))
    try:
        with service.client() as client:
            lists = [
                client.get(f"/v1/sandboxes/{made.sandbox_id}/egress").json()["allow"]
                for made in (closed, listed, default)
            ]
        assert lists == [[], network["allow_out"], [f"127.0.0.2:{allowed.port}"]]
        _assert_info_as_created(service, closed, listed, default, network["allow_out"])
        _until_refused(service, closed.sandbox_id, f"http://127.0.0.2:{allowed.port}/closed")
        closed.update_network({"allow_out": [f"127.0.0.2:{allowed.port}"], "deny_out": [ALL_TRAFFIC]})
        answer = _run(service, closed.sandbox_id, _fetch(f"http://127.0.0.2:{allowed.port}/opened"))
        assert answer["output"].strip() == "hello from 127.0.0.2"  # the next connection
        changed = closed.get_info()  # as the update set it, not as the create did
        assert changed.network == {"allow_out": [f"127.0.0.2:{allowed.port}"], "deny_out": [ALL_TRAFFIC]}
        listed.update_network({})  # E2B's default, all traffic: the template's list
        closed.update_network({"allow_internet_access": False})
        with service.client() as client:
            after = [client.get(f"/v1/sandboxes/{made.sandbox_id}/egress").json()["allow"] for made in (closed, listed)]
        assert after == [[], [f"127.0.0.2:{allowed.port}"]]
        with pytest.raises(SandboxException, match="denyOut"):
            closed.update_network({"deny_out": ["example.com"]})
        with pytest.raises(SandboxException, match="denyOut"):  # E2B's: addresses and networks only
            Sandbox.create(network={"deny_out": ["example.com"]}, **opts(service))
    finally:
        for made in (closed, listed, default):
            made.kill()


def _assert_info_as_created(
    service: Running, closed: Sandbox, listed: Sandbox, default: Sandbox, allow: list[str]
) -> None:
    """``get_info`` (sync, and async by id) says what each create asked: no internet but
    ``allow_out``, as E2B's ``allow_internet_access`` and ``network``; nothing for the default."""
    infos = [made.get_info() for made in (closed, listed, default)]
    assert [(info.allow_internet_access, info.network) for info in infos] == [
        (False, {"allow_out": [], "deny_out": [ALL_TRAFFIC]}),
        (False, {"allow_out": allow, "deny_out": [ALL_TRAFFIC]}),
        (None, None),
    ]
    fetched = asyncio.run(AsyncSandbox.get_info(listed.sandbox_id, **opts(service)))
    assert (fetched.allow_internet_access, fetched.network) == (False, {"allow_out": allow, "deny_out": [ALL_TRAFFIC]})


def test_a_create_without_egress_takes_no_list_and_its_rules_must_parse(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    needs(HAS_BWRAP, "bubblewrap is not installed")
    settings = settings_for(tmp_path_factory.mktemp("noegress-create"))
    with running(settings) as svc, svc.client() as client:
        listed = client.post("/v1/sandboxes", json={"egress_allow": ["example.com"]})
        malformed = client.post("/v1/sandboxes", json={"egress_allow": ["not a rule"]})
        with SandboxClient(svc.url, KEYS["alice"]) as sdk:
            with pytest.raises(InvalidRequest, match="has no egress"):
                sdk.create(egress_allow=["example.com"])
            key = f"egress-{uuid.uuid4()}"
            with sdk.create(egress_allow=[], idempotency_key=key) as empty:  # nothing: what it has anyway
                assert client.get(f"/v1/sandboxes/{empty.id}/egress").json() == {"allow": []}
                assert sdk.create(egress_allow=[], idempotency_key=key).id == empty.id  # a replay
                with pytest.raises(InvalidRequest, match="another body"):  # the list is in the digest
                    sdk.create(idempotency_key=key)
        e2b = Sandbox.create(allow_internet_access=False, **opts(svc))  # nothing: what it has anyway
        try:
            e2b.update_network({"allow_internet_access": False})
            with pytest.raises(SandboxException, match="has no egress"):
                e2b.update_network({"allow_out": ["example.com"], "deny_out": [ALL_TRAFFIC]})
        finally:
            e2b.kill()
    assert listed.status_code == 409
    assert "has no egress" in listed.json()["message"]
    assert malformed.status_code == 422
    assert "egress_allow" in malformed.json()["message"]


@pytest.mark.parametrize("kind", ["docker", "local"])
def test_a_creates_own_allow_list_outlives_a_restart(
    kind: str, request: pytest.FixtureRequest, allowed: Target, refused: Target, tmp_path: Path
) -> None:
    """Docker's from the container's labels, the local jail's from its state file."""
    settings, docker_client = _settings(kind, request, allowed, tmp_path)
    own = [f"127.0.0.3:{refused.port}"]
    with running(settings, docker_client=docker_client) as svc, svc.client() as client:
        made = create(client, egress_allow=own)["id"]
    with running(settings, docker_client=docker_client) as svc, svc.client() as client:
        try:
            assert client.get(f"/v1/sandboxes/{made}/egress").json() == {"allow": own}
            _until_refused(svc, made, f"http://127.0.0.2:{allowed.port}/after")
        finally:
            client.delete(f"/v1/sandboxes/{made}")


@pytest.mark.parametrize("kind", ["docker", "local"])
def test_a_changed_allow_list_outlives_a_restart(
    kind: str, request: pytest.FixtureRequest, allowed: Target, refused: Target, tmp_path: Path
) -> None:
    """The list ``PUT .../egress`` set, from the replica's state file (a container's labels hold the create's)."""
    settings, docker_client = _settings(kind, request, allowed, tmp_path)
    changed = [f"127.0.0.3:{refused.port}"]
    with running(settings, docker_client=docker_client) as svc, svc.client() as client:
        made = create(client)["id"]
        assert client.put(f"/v1/sandboxes/{made}/egress", json={"allow": changed}).status_code == 200
    with running(settings, docker_client=docker_client) as svc, svc.client() as client:
        try:
            assert client.get(f"/v1/sandboxes/{made}/egress").json() == {"allow": changed}
            _until_refused(svc, made, f"http://127.0.0.2:{allowed.port}/after")
        finally:
            client.delete(f"/v1/sandboxes/{made}")


@pytest.fixture
def replicas(request: pytest.FixtureRequest, allowed: Target, tmp_path: Path) -> Iterator[tuple[Running, Running]]:
    """Two replicas, A and B, on one Docker engine and ONE data directory, each reading a record
    again at every request (``confirm_interval`` 0)."""
    settings, docker_client = _settings("docker", request, allowed, tmp_path)
    settings = settings.model_copy(update={"confirm_interval": 0, "preview_domain": "sandboxes.test"})
    with running(settings, docker_client=docker_client) as a, running(settings, docker_client=docker_client) as b:
        yield a, b


PREVIEW = "/ports/8000"
"""A port of the sandbox nothing listens on: a request let in answers 502, one kept out 401."""


def test_a_network_changed_through_one_replica_applies_on_the_replica_serving_it(
    replicas: tuple[Running, Running], allowed: Target, refused: Target
) -> None:
    """B serves the sandbox's egress and its preview URLs; A changes its allow-list and makes a
    port public (the state file it writes in the shared data directory), and B applies both from
    its next connection, as it reads the record again."""
    a, b = replicas
    changed = [f"127.0.0.3:{refused.port}"]
    with b.client() as on_b, a.client() as on_a, b.client(None) as stranger:
        made = create(on_b)["id"]  # B holds it and listens for its egress
        try:
            _until_listening(b, made, allowed)
            assert stranger.get(f"/v1/sandboxes/{made}{PREVIEW}/").status_code == 401
            assert on_a.put(f"/v1/sandboxes/{made}/egress", json={"allow": changed}).status_code == 200
            assert on_a.put(f"/v1/sandboxes/{made}{PREVIEW}", json={"public": True}).status_code == 200
            answer = _run(b, made, _fetch(f"http://127.0.0.3:{refused.port}/through-b"))
            assert answer["output"].strip() == "hello from 127.0.0.3", answer
            assert "403 egress refused" in _run(b, made, _fetch(f"http://127.0.0.2:{allowed.port}/"))["output"]
            assert on_b.get(f"/v1/sandboxes/{made}/egress").json() == {"allow": changed}
            assert stranger.get(f"/v1/sandboxes/{made}{PREVIEW}/").status_code == 502  # let in
            assert on_a.put(f"/v1/sandboxes/{made}{PREVIEW}", json={"public": False}).status_code == 200
            assert stranger.get(f"/v1/sandboxes/{made}{PREVIEW}/").status_code == 401
        finally:
            on_a.delete(f"/v1/sandboxes/{made}")


def test_a_replica_that_does_not_hold_a_sandbox_reads_the_network_another_set(
    replicas: tuple[Running, Running], refused: Target
) -> None:
    """A holds neither sandbox B made and changed: a stranger's request for a public port (ours,
    E2B's ``allow_public_traffic``, by path and on its host of the preview domain) is let in on
    A, which adopts the sandbox with what B recorded."""
    a, b = replicas
    changed = [f"127.0.0.3:{refused.port}"]
    with b.client() as on_b, a.client(None) as stranger, a.client() as on_a:
        made = create(on_b)["id"]
        opened = Sandbox.create(network={"allow_public_traffic": True}, **opts(b))
        try:
            assert on_b.put(f"/v1/sandboxes/{made}{PREVIEW}", json={"public": True}).status_code == 200
            assert on_b.put(f"/v1/sandboxes/{made}/egress", json={"allow": changed}).status_code == 200
            assert stranger.get(f"/v1/sandboxes/{made}{PREVIEW}/").status_code == 502  # let in
            host = {"Host": f"8000-{opened.sandbox_id}.sandboxes.test"}  # E2B's, not a preview's 401
            assert stranger.get("/", headers=host).status_code == 502
            e2b = {"E2b-Sandbox-Id": opened.sandbox_id, "E2b-Sandbox-Port": "8000"}
            assert stranger.get("/e2b/envd/", headers=e2b).status_code == 502  # no traffic token needed
            assert on_a.get(f"/v1/sandboxes/{made}/egress").json() == {"allow": changed}
        finally:
            opened.kill()
            on_b.delete(f"/v1/sandboxes/{made}")


def test_a_list_that_a_record_cannot_hold_reads_back_as_nothing() -> None:
    backend = ProviderBackend("default", LocalTemplate(egress=True), provider=None, settings=None)  # type: ignore[arg-type]
    base = {LABEL_TENANT: "alice", LABEL_SERVICE_ID: "s1", LABEL_SERVICE_EXPIRES: "9999999999"}
    found = [
        state_from_record(SandboxRecord(id="s1", ref="r", labels={**base, **extra}), backend)
        for extra in ({}, {LABEL_EGRESS_ALLOW: '["example.com:443"]'}, {LABEL_EGRESS_ALLOW: EGRESS_NOT_RECORDED})
    ]
    assert [state.egress_allow if state else "?" for state in found] == [None, ["example.com:443"], []]


def test_the_templates_bandwidth_paces_a_sandboxs_egress(tmp_path: Path, allowed: Target) -> None:
    needs(HAS_BWRAP, "bubblewrap is not installed")
    rate = 128 << 10
    template = LocalTemplate(
        default_timeout=60,
        egress=True,
        egress_allow=[f"127.0.0.2:{allowed.port}"],
        egress_open_ranges=["127.0.0.0/8"],
        egress_bytes_per_second=rate,
    )
    settings = settings_for(tmp_path, templates={"default": template})
    size = 3 * rate  # three seconds of the rate, less its one-second burst
    with running(settings) as svc, svc.client() as client:
        made = create(client)["id"]
        try:
            _until_listening(svc, made, allowed)
            started = time.monotonic()
            answer = _run(svc, made, f"curl -sS --max-time 30 http://127.0.0.2:{allowed.port}/bytes/{size} | wc -c")
            took = time.monotonic() - started
        finally:
            client.delete(f"/v1/sandboxes/{made}")
    assert answer["output"].strip() == str(size)
    assert took >= (size - rate) / rate * 0.9, took
