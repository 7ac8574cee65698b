"""The Python client against the real service, in-process under a real uvicorn on loopback.

`RemoteSandbox` runs the whole sandbox conformance suite over HTTP (LocalSandbox behind the
service). The retry rules are proven with real sockets: a service that is down then comes up,
a proxy that drops connections after the request was sent, and a command that appends to a
file so that running it twice would show.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import io
import json
import shlex
import socket
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from sandboxes import protocol as p
from sandboxes.client import (
    AsyncSandboxClient,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    RateLimited,
    RemoteSandbox,
    SandboxClient,
    ServiceUnreachable,
    TooLarge,
    Unauthorized,
)
from sandboxes.client.errors import OperationFailed, error_from_response, parse_retry_after
from sandboxes.local import LocalTemplate
from sandboxes.semantics import message_for
from sandboxes.server import app as server_app
from sandboxes.server.auth import hash_key
from sandboxes.server.settings import ServiceSettings, TenantPolicy
from sandboxes.testing import SandboxConformance

KEY = "sbx_main_" + uuid.uuid4().hex
OTHER_KEY = "sbx_other_" + uuid.uuid4().hex
LIMITED_KEY = "sbx_limited_" + uuid.uuid4().hex
SLOW_KEY = "sbx_slow_" + uuid.uuid4().hex
MAX_BODY = 32 << 20


KEEPALIVE = 0.5
"""Seconds between a quiet stream's keep-alive events: so short that every stream test here
sees some, which the client must skip."""


def _settings(data_dir: Path) -> ServiceSettings:
    return ServiceSettings(
        data_dir=data_dir,
        templates={"default": LocalTemplate(isolation="bwrap", default_timeout=60)},
        api_keys={
            hash_key(KEY): "main",
            hash_key(OTHER_KEY): "other",
            hash_key(LIMITED_KEY): "limited",
            hash_key(SLOW_KEY): "slow",
        },
        tenants={
            "main": TenantPolicy(max_sandboxes=50, rate=10_000, burst=10_000),
            "limited": TenantPolicy(max_sandboxes=1, rate=10_000, burst=10_000),
            "slow": TenantPolicy(max_sandboxes=5, rate=2, burst=3),
        },
        max_body_bytes=MAX_BODY,
        stream_keepalive=KEEPALIVE,
    )


class _Service:
    """The real app under a real uvicorn in a thread, on a socket the test owns.

    The socket is bound before the server starts but only listens once it has: until then a
    connection is refused, exactly like a service that is down."""

    def __init__(self, data_dir: Path, sock: socket.socket | None = None) -> None:
        self.sock = sock or _bound_socket()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(
            server_app.create_app(_settings(data_dir)), log_level="warning", lifespan="on", timeout_keep_alive=5
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> _Service:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive(), "the service died while starting"
            assert time.monotonic() < deadline, "the service did not start"
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


def _bound_socket() -> socket.socket:
    # proto must say TCP: asyncio sets TCP_NODELAY on accepted connections only then, and
    # without it every response waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Service]:
    running = _Service(tmp_path_factory.mktemp("service")).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(service: _Service) -> Iterator[SandboxClient]:
    with SandboxClient(service.url, KEY) as c:
        yield c


@pytest.fixture(scope="module")
def remote(client: SandboxClient) -> Iterator[RemoteSandbox]:
    with client.create("default", labels={"suite": "client"}) as sb:
        yield sb


@pytest.fixture(scope="module")
def workdir(remote: RemoteSandbox) -> str:
    """The sandbox's home (LocalSandbox paths are real paths), where its commands start."""
    assert remote.workdir is not None
    assert remote.execute("pwd").output == f"{remote.workdir}\n"
    return remote.workdir


# ---------------------------------------------------------------------- conformance


class TestRemoteSandboxConformance(SandboxConformance):
    @pytest.fixture
    def backend(self, remote: RemoteSandbox) -> RemoteSandbox:
        return remote

    @pytest.fixture
    def base_dir(self, workdir: str) -> str:
        return workdir


class TestRemoteSandboxTarUploads:
    """``upload_files`` sends big files as tar streams: the conformance cases about batches
    must answer exactly the same when (nearly) every file takes that path."""

    @pytest.fixture
    def tarring(self, service: _Service, remote: RemoteSandbox) -> Iterator[RemoteSandbox]:
        with SandboxClient(service.url, KEY, inline_upload_bytes=1, max_batch_bytes=2) as c:
            yield c.attach(remote.id)

    @pytest.mark.parametrize(
        "case",
        [
            "test_batches_keep_order_and_report_per_file",
            "test_large_files_in_batches_report_per_file",
            "test_batch_of_many_files",
            "test_binary_over_preview_cap_is_refused_by_read",
            "test_edit_keeps_crlf_files_crlf",
        ],
    )
    def test_conformance_case(self, tarring: RemoteSandbox, workdir: str, case: str) -> None:
        getattr(SandboxConformance(), case)(tarring, f"{workdir}/tar-{uuid.uuid4().hex[:8]}")

    @pytest.mark.parametrize("bad", ["relative.bin", "/a/../b", ""])
    def test_bad_paths_never_leave(self, tarring: RemoteSandbox, bad: str) -> None:
        assert tarring.upload_files([(bad, b"big enough")])[0].error == p.INVALID_PATH

    def test_async_and_root(self, tarring: RemoteSandbox, workdir: str) -> None:
        path = f"{workdir}/async-tar/big.bin"
        blob = bytes(range(256)) * 1000
        assert asyncio.run(tarring.aupload_files([(path, blob), ("/", b"xx")])) == [
            p.FileUploadResponse(path),
            p.FileUploadResponse("/", p.IS_DIRECTORY, message_for(p.IS_DIRECTORY, "/")),
        ]
        assert tarring.download_files([path])[0].content == blob


# ---------------------------------------------------------------------- lifecycle


def test_lifecycle(client: SandboxClient) -> None:
    sb = client.create("default", env={"GREETING": "hi"}, ttl=600, labels={"team": "a"})
    try:
        assert sb.info is not None
        assert (sb.info.template, sb.info.backend, sb.info.labels) == ("default", "local", {"team": "a"})
        assert sb.info.expires_at is not None
        assert sb.info.expires_at - sb.info.created_at == pytest.approx(600, abs=5)
        assert sb.execute('printf %s "$GREETING"').output == "hi"
        assert sb.id in {info.id for info in client.list()}
        assert client.get(sb.id) == sb.refresh()
        before = sb.info.expires_at
        renewed = sb.renew(3600)
        assert renewed.expires_at is not None
        assert renewed.expires_at > before + 2000
    finally:
        sb.destroy()
    assert sb.id not in {info.id for info in client.list()}
    with pytest.raises(NotFound) as missing:
        client.get(sb.id)
    assert (missing.value.code, missing.value.status) == ("not_found", 404)
    with pytest.raises(NotFound):
        sb.ls("/")


def test_health(client: SandboxClient) -> None:
    assert client.health() is not None
    assert client.ready()


def test_another_tenants_sandbox_is_not_found(service: _Service, remote: RemoteSandbox) -> None:
    with SandboxClient(service.url, OTHER_KEY) as other:
        with pytest.raises(NotFound):
            other.get(remote.id)
        with pytest.raises(NotFound):
            other.attach(remote.id).execute("true")
        assert remote.id not in {info.id for info in other.list()}


# ---------------------------------------------------------------------- error mapping


def test_bad_key_is_unauthorized(service: _Service) -> None:
    for key in ("wrong-key", None):
        with SandboxClient(service.url, key, retries=0) as bad, pytest.raises(Unauthorized) as refused:
            bad.list()
        assert refused.value.status == 401
        assert refused.value.code == "unauthorized"
        assert refused.value.request_id


def test_unknown_template_is_invalid_request(client: SandboxClient) -> None:
    with pytest.raises(InvalidRequest) as refused:
        client.create("no-such-template")
    assert refused.value.status is not None
    assert 400 <= refused.value.status < 500


def test_client_side_validation_raises_invalid_request(client: SandboxClient) -> None:
    with pytest.raises(InvalidRequest):
        client.create(ttl=-5)
    with pytest.raises(ValueError, match="http://"):
        SandboxClient("127.0.0.1:8080", KEY)


def test_quota_exceeded(service: _Service) -> None:
    with SandboxClient(service.url, LIMITED_KEY) as limited, limited.create():
        with pytest.raises(QuotaExceeded) as refused:
            limited.create()
        assert refused.value.code == "quota_exceeded"


def test_body_over_the_limit_is_too_large(remote: RemoteSandbox, workdir: str) -> None:
    with pytest.raises(TooLarge) as refused:
        remote.write(f"{workdir}/huge.txt", "x" * (MAX_BODY + 1024))
    assert refused.value.status == 413
    assert remote.read(f"{workdir}/huge.txt").error == p.FILE_NOT_FOUND


def test_archive_of_missing_path_is_an_operation_failure(remote: RemoteSandbox, workdir: str) -> None:
    with pytest.raises(OperationFailed) as refused:
        list(remote.download_archive(f"{workdir}/no-such-dir"))
    assert refused.value.code == p.FILE_NOT_FOUND


def test_missing_cwd_answers_like_a_local_backend(remote: RemoteSandbox, workdir: str) -> None:
    result = remote.execute("pwd", cwd=f"{workdir}/no-such-dir")
    assert result.error == p.FILE_NOT_FOUND
    assert result.exit_code is None


def test_rate_limit_waits_retry_after_for_reads_but_never_replays_commands(service: _Service) -> None:
    with SandboxClient(service.url, SLOW_KEY, retries=0) as impatient, SandboxClient(service.url, SLOW_KEY) as patient:
        sb = patient.create()
        try:
            marker = f"{sb.execute('pwd').output.strip()}/runs"
            append = f"echo x >> {shlex.quote(marker)}"
            ran, refused = _until_rate_limited(lambda: impatient.attach(sb.id).execute(append))
            assert refused.status == 429
            assert refused.retry_after is not None
            assert refused.retry_after > 0
            waited = time.monotonic()
            for _ in range(3):  # the bucket is empty: a patient read waits out Retry-After
                assert sb.download_files([marker])[0].content == b"x\n" * ran
            assert time.monotonic() - waited >= 0.5
            more, _ = _until_rate_limited(lambda: sb.execute(append))  # retries=4, yet refused at once
            assert sb.download_files([marker])[0].content == b"x\n" * (ran + more)
        finally:
            sb.destroy()  # idempotent: retried through the rate limit


def _until_rate_limited(call: Any) -> tuple[int, RateLimited]:
    """How many calls passed before the first refusal, and that refusal."""
    for passed in range(50):
        try:
            assert call().exit_code == 0
        except RateLimited as exc:
            return passed, exc
    raise AssertionError("the rate limit never applied")


def test_error_mapping_of_bodies_and_statuses() -> None:
    request = httpx.Request("GET", "http://127.0.0.1/v1/sandboxes")
    body = {"error": "quota_exceeded", "message": "3 of 3 sandboxes", "request_id": "r-1"}
    error = error_from_response(httpx.Response(403, json=body, request=request))
    assert isinstance(error, QuotaExceeded)
    assert (error.code, error.status, error.request_id, error.message) == (
        "quota_exceeded",
        403,
        "r-1",
        body["message"],
    )
    assert "r-1" in str(error)
    limited = error_from_response(httpx.Response(429, headers={"retry-after": "2"}, request=request))
    assert isinstance(limited, RateLimited)
    assert limited.retry_after == 2
    proxy = error_from_response(httpx.Response(502, text="<html>bad gateway</html>", request=request))
    assert proxy.code == "backend_unavailable"
    assert "bad gateway" in proxy.message
    framework = error_from_response(httpx.Response(422, json={"detail": [{"msg": "field required"}]}))
    assert isinstance(framework, InvalidRequest)
    assert "field required" in framework.message
    protocol_code = error_from_response(httpx.Response(404, json={"error": "file_not_found", "message": "x"}))
    assert isinstance(protocol_code, OperationFailed)
    assert not isinstance(protocol_code, NotFound)
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0
    assert parse_retry_after("soon") is None


# ---------------------------------------------------------------------- retries over real sockets


def test_down_service_coming_up_is_waited_for(tmp_path: Path) -> None:
    """Connection refused means nothing was sent: every call, even create and execute, retries."""
    late = _Service(tmp_path)
    starter = threading.Timer(0.8, late.start)
    started = time.monotonic()
    starter.start()
    try:
        with SandboxClient(late.url, KEY, retries=8, backoff=0.1, max_backoff=0.5) as c:
            assert c.list() == []
            assert time.monotonic() - started >= 0.7
            with c.create() as sb:
                assert sb.execute("echo up").output == "up\n"
    finally:
        starter.join()
        late.stop()


def test_down_service_raises_unreachable_after_retries() -> None:
    sock = _bound_socket()  # bound, never listening: refused
    try:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with SandboxClient(url, KEY, retries=2, backoff=0.01) as c:
            started = time.monotonic()
            with pytest.raises(ServiceUnreachable) as down:
                c.list()
            assert down.value.status is None
            with pytest.raises(ServiceUnreachable):  # not converted: the sandbox cannot be reached at all
                c.attach("any").execute("true")
            assert time.monotonic() - started < 5
    finally:
        sock.close()


def test_execute_is_never_sent_twice(service: _Service, remote: RemoteSandbox, workdir: str) -> None:
    """A read timeout after the request was sent: the command ran (once); the client says
    ``connection_lost`` instead of running it again."""
    marker = f"{workdir}/appended-{uuid.uuid4().hex[:6]}"
    with SandboxClient(service.url, KEY, timeout=1.0, retries=5, backoff=0.01) as short:
        started = time.monotonic()
        result = short.attach(remote.id).execute(f"echo run >> {shlex.quote(marker)}; sleep 3")
        assert time.monotonic() - started < 2.5
    assert result.error == p.CONNECTION_LOST
    assert result.exit_code is None
    time.sleep(3)
    assert remote.download_files([marker])[0].content == b"run\n"


class _DroppingProxy:
    """A loopback TCP proxy that reads each of the next ``drop`` requests and closes the
    connection without answering: the service never sees them, the client cannot know that."""

    def __init__(self, upstream: str) -> None:
        self.upstream = httpx.URL(upstream)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.drop = 0
        self.dropped = 0
        self.forwarded: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """Break every connection forwarded so far, as a proxy that gave up on them would."""
        for sock in self.forwarded:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self.drop > 0:
                self.drop -= 1
                self.dropped += 1
                conn.recv(65536)
                conn.close()
                continue
            upstream = socket.create_connection((self.upstream.host, self.upstream.port or 80))
            self.forwarded.append(conn)
            for source, target in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_pump, args=(source, target), daemon=True).start()

    def close(self) -> None:
        self.listener.close()


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, target):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def test_dropped_connections_retry_reads_and_report_writes(
    service: _Service, remote: RemoteSandbox, workdir: str
) -> None:
    proxy = _DroppingProxy(service.url)
    path = f"{workdir}/proxied.txt"
    remote.write(path, "before\n")
    try:
        one_per_request = httpx.HTTPTransport(limits=httpx.Limits(max_keepalive_connections=0))
        with SandboxClient(proxy.url, KEY, retries=3, backoff=0.01, transport=one_per_request) as c:
            proxied = c.attach(remote.id)
            proxy.drop = 2
            assert proxied.read(path).file_data == p.FileData("before\n")  # retried twice, then read
            assert proxy.dropped == 2
            proxy.drop = 1
            lost = proxied.write(path, "after\n")
            assert (lost.error, lost.path) == (p.CONNECTION_LOST, None)
            assert proxy.dropped == 3
            proxy.drop = 1
            assert proxied.execute(f"echo again >> {shlex.quote(path)}").error == p.CONNECTION_LOST
            proxy.drop = 1
            assert proxied.upload_files([(path, b"x")])[0].error == p.CONNECTION_LOST
            assert proxy.dropped == 5
            assert proxied.download_files([path])[0].content == b"before\n"  # nothing was replayed
    finally:
        proxy.close()


@pytest.mark.parametrize("retries", [0, 2])
def test_a_read_is_attempted_exactly_retries_plus_one_times(
    service: _Service, remote: RemoteSandbox, workdir: str, retries: int
) -> None:
    """A call is attempted once, then once more per failure `retries` allows: the count and the
    outcome stay."""
    proxy = _DroppingProxy(service.url)
    try:
        one_per_request = httpx.HTTPTransport(limits=httpx.Limits(max_keepalive_connections=0))
        with SandboxClient(proxy.url, KEY, retries=retries, backoff=0.01, transport=one_per_request) as c:
            proxy.drop = 10
            lost = c.attach(remote.id).read(f"{workdir}/anything")
            assert lost.error == p.CONNECTION_LOST
            assert proxy.dropped == retries + 1
    finally:
        proxy.close()


def test_a_url_with_a_path_keeps_it_on_every_call() -> None:
    """The service behind a reverse proxy at a path: every request goes under that path."""
    seen: list[str] = []
    info = {"id": "a/b", "template": "default", "backend": "local", "created_at": 1.0, "expires_at": None}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            body = json.dumps({"sandboxes": []} if self.path.endswith("/sandboxes") else info).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with SandboxClient(f"http://127.0.0.1:{server.server_address[1]}/behind/proxy/", KEY) as c:
            for _ in range(2):  # the second time from the client's cache of addresses
                assert c.list() == []
                assert c.get("a/b").id == "a/b"
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["/behind/proxy/v1/sandboxes", "/behind/proxy/v1/sandboxes/a%2Fb"] * 2


# ---------------------------------------------------------------------- streaming


def test_execute_stream_yields_chunks_as_they_happen(remote: RemoteSandbox) -> None:
    seen: list[tuple[float, str | p.ExecuteResponse]] = []
    started = time.monotonic()
    for item in remote.execute_stream("echo first; sleep 1; echo second >&2; exit 4"):
        seen.append((time.monotonic() - started, item))
    *chunks, (_, final) = seen
    assert isinstance(final, p.ExecuteResponse)
    assert (final.exit_code, final.output) == (4, "first\nsecond\n")
    assert all(isinstance(chunk, str) for _, chunk in chunks)
    assert "".join(str(chunk) for _, chunk in chunks) == "first\nsecond\n"
    first_at = next(at for at, chunk in chunks if "first" in str(chunk))
    assert seen[-1][0] - first_at >= 0.8, "the first line arrived only with the exit"


def test_execute_stream_timeout_and_stdin(remote: RemoteSandbox) -> None:
    *chunks, final = list(remote.execute_stream("cat; sleep 30", stdin="piped\n", timeout=1))
    assert "".join(str(chunk) for chunk in chunks) == "piped\n"
    assert isinstance(final, p.ExecuteResponse)
    assert final.error == p.TIMEOUT
    assert final.exit_code is None


def test_a_quiet_stream_outlasts_the_clients_read_timeout(service: _Service, remote: RemoteSandbox) -> None:
    """The service's keep-alives reset the client's read timeout: a command silent for longer
    than it is not lost, and needs no re-attach."""
    proxy = _DroppingProxy(service.url)
    try:
        with SandboxClient(proxy.url, KEY, timeout=4 * KEEPALIVE) as c:
            items = list(c.attach(remote.id).execute_stream(f"sleep {8 * KEEPALIVE}; echo done"))
    finally:
        proxy.close()
    assert len(proxy.forwarded) == 1, "the stream was followed again: it timed out"
    assert items == ["done\n", items[-1]]
    assert isinstance(items[-1], p.ExecuteResponse)
    assert (items[-1].exit_code, items[-1].output, items[-1].error) == (0, "done\n", None)


def test_a_dropped_stream_is_followed_again_from_where_it_was(
    service: _Service, remote: RemoteSandbox, workdir: str
) -> None:
    """The proxy breaks the stream mid-command: the client re-attaches once, by itself, and gets
    exactly the rest; the command was not killed. ``attach_stream`` reads it again later."""
    go = f"{workdir}/go-{uuid.uuid4().hex}"
    command = f"printf 'first\\n'; while [ ! -e {shlex.quote(go)} ]; do sleep 0.05; done; printf 'second\\n'; exit 5"
    proxy = _DroppingProxy(service.url)
    try:
        one_per_request = httpx.HTTPTransport(limits=httpx.Limits(max_keepalive_connections=0))
        with SandboxClient(proxy.url, KEY, transport=one_per_request) as c:
            proxied = c.attach(remote.id)
            stream = proxied.execute_stream(command)
            assert next(stream) == "first\n"
            assert stream.command_id is not None
            assert stream.offset == len("first\n")
            proxy.cut()
            remote.write(go, "")  # only now may the command go on
            *chunks, final = list(stream)
            assert len(proxy.forwarded) == 2, "one stream, one re-attach"
            again = list(proxied.attach_stream(stream.command_id, offset=2))
    finally:
        proxy.close()
    assert chunks == ["second\n"]
    assert isinstance(final, p.ExecuteResponse)
    assert (final.exit_code, final.output, final.error) == (5, "first\nsecond\n", None)
    assert "".join(map(str, again[:-1])) == "rst\nsecond\n"
    assert again[-1] == final


def test_an_async_dropped_stream_is_followed_again_from_where_it_was(
    service: _Service, remote: RemoteSandbox, workdir: str
) -> None:
    go = f"{workdir}/go-{uuid.uuid4().hex}"
    command = f"printf 'one\\n'; while [ ! -e {shlex.quote(go)} ]; do sleep 0.05; done; printf 'two\\n'"
    proxy = _DroppingProxy(service.url)

    async def scenario() -> list[str | p.ExecuteResponse]:
        async with AsyncSandboxClient(proxy.url, KEY) as aclient:
            stream = aclient.attach(remote.id).aexecute_stream(command)
            assert await anext(stream) == "one\n"
            proxy.cut()
            await asyncio.to_thread(remote.write, go, "")
            return [item async for item in stream]

    try:
        *chunks, final = asyncio.run(scenario())
    finally:
        proxy.close()
    assert len(proxy.forwarded) == 2, "one stream, one re-attach"
    assert chunks == ["two\n"]
    assert isinstance(final, p.ExecuteResponse)
    assert (final.exit_code, final.output) == (0, "one\ntwo\n")


def test_async_stream_processes_and_archives(service: _Service, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncSandboxClient(service.url, KEY) as aclient:
            sb = await aclient.create()
            async with sb:
                home = (await sb.aexecute("pwd")).output.strip()
                *chunks, final = [item async for item in sb.aexecute_stream("echo a; echo b")]
                assert isinstance(final, p.ExecuteResponse)
                assert (final.output, final.exit_code, "".join(map(str, chunks))) == ("a\nb\n", 0, "a\nb\n")
                started = await sb.astart_process("echo begun; sleep 0.3; echo ended")
                finished = await sb.await_process(started.id, timeout=20)
                assert finished.status == "exited"
                assert finished.result is not None
                assert (finished.result.exit_code, finished.result.output) == (0, "begun\nended\n")
                await sb.aupload_archive(f"{home}/unpacked", _tar({"a/b.txt": b"bee", "c.bin": b"\x00\xff"}))
                assert (await sb.aread(f"{home}/unpacked/a/b.txt")).file_data == p.FileData("bee")
                blob = b"".join([chunk async for chunk in sb.adownload_archive(f"{home}/unpacked")])
                assert _untar(blob) == {"unpacked/a/b.txt": b"bee", "unpacked/c.bin": b"\x00\xff"}
                assert sb.ls(f"{home}/unpacked").error is None  # the sync side of an async handle
            with pytest.raises(NotFound):
                await aclient.get(sb.id)

    asyncio.run(scenario())


def test_background_process_kill(remote: RemoteSandbox, workdir: str) -> None:
    started = remote.start_process(f"echo started; sleep 60; echo never > {shlex.quote(workdir)}/never")
    assert started.status == "running"
    deadline = time.monotonic() + 10
    while "started" not in remote.poll_process(started.id).output:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    killed = remote.kill_process(started.id)
    assert killed.status == "killed"
    assert remote.poll_process(started.id).status == "killed"
    with pytest.raises(NotFound):
        remote.poll_process("no-such-process")


def test_archive_streams_both_ways(remote: RemoteSandbox, workdir: str) -> None:
    """A 24 MiB tar goes up from a generator and comes back in many chunks: never whole."""
    size = 24 << 20
    payload = bytes(range(256)) * (size // 256)
    produced: list[int] = []

    def body() -> Iterator[bytes]:
        blob = _tar({"big/data.bin": payload, "big/small.txt": b"small"})
        for offset in range(0, len(blob), 1 << 20):
            produced.append(offset)
            yield blob[offset : offset + (1 << 20)]

    remote.upload_archive(f"{workdir}/arch", body())
    assert len(produced) > 20
    assert remote.ls(f"{workdir}/arch/big").entries == [
        p.FileInfo(f"{workdir}/arch/big/data.bin", False, size, _mtime(remote, f"{workdir}/arch/big/data.bin")),
        p.FileInfo(f"{workdir}/arch/big/small.txt", False, 5, _mtime(remote, f"{workdir}/arch/big/small.txt")),
    ]
    chunks = list(remote.download_archive(f"{workdir}/arch/big"))
    assert len(chunks) > 10
    assert max(len(c) for c in chunks) <= 1 << 20
    assert _untar(b"".join(chunks)) == {"big/data.bin": payload, "big/small.txt": b"small"}


def _mtime(remote: RemoteSandbox, path: str) -> str | None:
    parent = path.rsplit("/", 1)[0]
    return next(e.modified_at for e in remote.ls(parent).entries or [] if e.path == path)


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _untar(blob: bytes) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as archive:
        for member in archive:
            if member.isfile():
                extracted = archive.extractfile(member)
                assert extracted is not None
                found[member.name] = extracted.read()
    return found
