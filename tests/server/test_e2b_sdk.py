"""The real E2B SDK (sync and async), unchanged, against the service on loopback through its
E2B-compatible API (`sandboxes.server.e2b`), over the local jail and over Docker: lifecycle,
list and pagination, commands (stdout and stderr apart, exit codes), files, and isolation
between tenants and between sandboxes."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    CommandExitException,
    FileNotFoundException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxNotRunningException,
    SandboxQuery,
    Template,
    TemplateException,
    TimeoutException,
)
from e2b_harness import opts, service_fixture
from service_harness import KEYS, Running, running, settings_for
from support import HAS_BWRAP, needs

service = service_fixture("e2b")


@pytest.fixture(scope="module")
def sandbox(service: Running) -> Iterator[Sandbox]:
    created = Sandbox.create(timeout=3600, **opts(service))  # the module's life, past the 300 s default
    yield created
    created.kill()


def test_commands_keep_stdout_and_stderr_apart_and_raise_on_a_nonzero_exit(sandbox: Sandbox) -> None:
    assert sandbox.commands.run("echo hi").stdout == "hi\n"
    result = sandbox.commands.run("echo out; echo err >&2; echo $0 $FOO", envs={"FOO": "bar"})
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n/bin/bash bar\n", "err\n", 0)
    seen: list[str] = []
    sandbox.commands.run("echo one; echo two", on_stdout=seen.append)
    assert "".join(seen) == "one\ntwo\n"
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("echo bad >&2; exit 3")
    assert (failed.value.exit_code, failed.value.stderr) == (3, "bad\n")


def test_files_are_written_and_read_as_text_and_bytes(sandbox: Sandbox) -> None:
    info = sandbox.files.write("notes/hello.txt", "héllo\n")
    assert info.name == "hello.txt"
    assert info.path.endswith("/notes/hello.txt")
    assert sandbox.files.read("notes/hello.txt") == "héllo\n"
    blob = bytes(range(256)) * 4
    sandbox.files.write("/tmp/blob.bin", blob)
    assert bytes(sandbox.files.read("/tmp/blob.bin", format="bytes")) == blob
    assert sandbox.commands.run("cat notes/hello.txt").stdout == "héllo\n"


def test_a_sandbox_is_listed_timed_and_killed(service: Running) -> None:
    options = opts(service)
    created = Sandbox.create(metadata={"case": "lifecycle"}, timeout=120, **options)
    try:
        info = created.get_info()
        assert info.template_id == "base"
        assert info.metadata == {"case": "lifecycle"}
        assert abs((info.end_at - info.started_at).total_seconds() - 120) < 5
        created.set_timeout(600)
        assert abs((created.get_info().end_at - datetime.now(UTC)).total_seconds() - 600) < 30
        query = SandboxQuery(metadata={"case": "lifecycle"})
        assert [s.sandbox_id for s in Sandbox.list(query=query, **options).next_items()] == [created.sandbox_id]
        assert created.is_running()
    finally:
        assert created.kill() is True
    assert not created.is_running()  # envd answers 502 for a killed sandbox
    with pytest.raises(SandboxNotRunningException):
        created.commands.run("echo too late")
    assert Sandbox.kill(created.sandbox_id, **options) is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(created.sandbox_id, **options)


def test_the_list_pages_with_a_next_token_newest_first(service: Running) -> None:
    options, tag = opts(service), uuid.uuid4().hex[:8]
    made = [Sandbox.create(metadata={"page": tag}, **options) for _ in range(3)]
    try:
        paginator = Sandbox.list(query=SandboxQuery(metadata={"page": tag}), limit=2, **options)
        first = paginator.next_items()
        assert paginator.has_next
        second = paginator.next_items()
        assert not paginator.has_next
        assert [s.sandbox_id for s in first + second] == [s.sandbox_id for s in reversed(made)]
        oldest = Sandbox.list(query=SandboxQuery(metadata={"page": tag}), order="asc", limit=1, **options).next_items()
        assert [s.sandbox_id for s in oldest] == [made[0].sandbox_id]
        since = SandboxQuery(metadata={"page": tag}, started_after=made[1].get_info().started_at)
        assert {s.sandbox_id for s in Sandbox.list(query=since, **options).next_items()} == {
            s.sandbox_id for s in made[1:]
        }
    finally:
        for created in made:
            created.kill()


async def test_the_async_sdk_runs_commands_and_files(service: Running) -> None:
    created = await AsyncSandbox.create(**opts(service))
    try:
        result = await created.commands.run("echo hi; echo err >&2")
        assert (result.stdout, result.stderr) == ("hi\n", "err\n")
        with pytest.raises(CommandExitException):
            await created.commands.run("exit 7")
        await created.files.write("a.bin", b"\x00\xff")
        assert bytes(await created.files.read("a.bin", format="bytes")) == b"\x00\xff"
        assert created.sandbox_id in [s.sandbox_id for s in await AsyncSandbox.list(**opts(service)).next_items()]
    finally:
        assert await created.kill() is True
    assert not await created.is_running()


def test_connect_returns_the_same_access_and_only_extends_the_timeout(service: Running, sandbox: Sandbox) -> None:
    before = sandbox.get_info().end_at
    again = Sandbox.connect(sandbox.sandbox_id, timeout=1, **opts(service))
    assert again.commands.run("echo back").stdout == "back\n"
    assert sandbox.get_info().end_at == before
    assert again.is_running()


def test_what_is_not_served_fails_with_the_sdks_own_exceptions(service: Running, sandbox: Sandbox) -> None:
    with pytest.raises(TemplateException, match="not implemented"):
        Template.exists("base", **opts(service))  # template builds are not served
    with pytest.raises(SandboxException, match="unknown template 'nope'"):
        Sandbox.create("nope", **opts(service))
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("/no/such/file")
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=1)


def test_a_snapshot_and_a_fork_carry_the_files_on_every_backend(service: Running, sandbox: Sandbox) -> None:
    """The E2B SDK's snapshots and fork over the local jail as over Docker (the service's
    snapshots are the same on every backend)."""
    sandbox.files.write("snapped/a.bin", b"\x00\xff")
    snapshot = sandbox.create_snapshot()
    try:
        made = Sandbox.create(snapshot.snapshot_id, timeout=60, **opts(service))
        try:
            assert bytes(made.files.read("snapped/a.bin", format="bytes")) == b"\x00\xff"
        finally:
            made.kill()
    finally:
        assert Sandbox.delete_snapshot(snapshot.snapshot_id, **opts(service)) is True
    [fork] = sandbox.fork(timeout=60)
    assert isinstance(fork, Sandbox), fork
    try:
        assert bytes(fork.files.read("snapped/a.bin", format="bytes")) == b"\x00\xff"
    finally:
        fork.kill()


def test_an_idempotency_key_makes_one_sandbox(service: Running) -> None:
    key = uuid.uuid4().hex
    first = Sandbox.create(idempotency_key=key, **opts(service))
    try:
        assert Sandbox.create(idempotency_key=key, **opts(service)).sandbox_id == first.sandbox_id
    finally:
        first.kill()


_ALICES = {
    ("GET", "/e2b/sandboxes/{sandbox_id}"): None,
    ("DELETE", "/e2b/sandboxes/{sandbox_id}"): None,
    ("POST", "/e2b/sandboxes/{sandbox_id}/timeout"): {"timeout": 100},
    ("POST", "/e2b/sandboxes/{sandbox_id}/connect"): {},
    ("POST", "/e2b/v2/sandboxes/{sandbox_id}/connect"): {},
    ("GET", "/e2b/sandboxes/{sandbox_id}/metrics"): None,
    ("POST", "/e2b/sandboxes/{sandbox_id}/pause"): {},
    ("POST", "/e2b/sandboxes/{sandbox_id}/resume"): {},
    ("PUT", "/e2b/sandboxes/{sandbox_id}/network"): {"allowOut": ["example.com"], "denyOut": ["0.0.0.0/0"]},
    ("POST", "/e2b/sandboxes/{sandbox_id}/snapshots"): {},
    ("POST", "/e2b/sandboxes/{sandbox_id}/fork"): {},
}
"""Control-plane routes that name a sandbox, with a body a tenant could send: 404 to another."""
_ENVD = {("GET", "/e2b/envd/health"), ("GET", "/e2b/envd/files"), ("POST", "/e2b/envd/files")}
_ENVD |= {
    ("POST", f"/e2b/envd/process.Process/{rpc}")
    for rpc in ("Start", "Connect", "List", "SendSignal", "SendInput", "StreamInput", "CloseStdin", "Update")
}
_ENVD |= {
    ("POST", f"/e2b/envd/filesystem.Filesystem/{rpc}") for rpc in ("Stat", "ListDir", "MakeDir", "Move", "Remove")
}
_ENVD |= {
    ("POST", f"/e2b/envd/filesystem.Filesystem/{rpc}")
    for rpc in ("WatchDir", "CreateWatcher", "GetWatcherEvents", "RemoveWatcher")
}
_ENVD |= {(method, "/e2b/envd/{rest:path}") for method in ("GET", "POST", "PUT", "DELETE")}
_ENVD |= {(m, "/e2b/envd/{path:path}") for m in ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")}
"""envd routes: refused (401) without the sandbox's own access token; ``{path:path}``: a port
other than envd's (`sandboxes.server.e2b.ports`), asked for with ``E2b-Sandbox-Port``."""
_OWN = {
    ("GET", "/e2b/sandboxes"): "lists the caller's own (checked below)",
    ("GET", "/e2b/v2/sandboxes"): "lists the caller's own (checked below)",
    ("POST", "/e2b/sandboxes"): "creates the caller's own",
    ("POST", "/e2b/v2/sandboxes"): "creates the caller's own",
    ("GET", "/e2b/snapshots"): "lists the caller's own (test_e2b_peer.py::test_a_tenants_snapshots_are_its_own)",
    ("DELETE", "/e2b/templates/{template_id}"): "deletes the caller's own snapshots (test_e2b_peer.py, as above)",
    **{(m, "/e2b/{rest:path}"): "the same 501 for any id" for m in ("GET", "POST", "PUT", "PATCH", "DELETE")},
}
"""Routes that reach no other tenant's sandbox, each with why."""


def _e2b_routes(routes: Any) -> Iterator[tuple[str, str]]:
    for route in routes:
        candidates = getattr(route, "effective_candidates", None)
        if candidates is not None:
            yield from _e2b_routes(candidates())
        elif getattr(route, "path", "").startswith("/e2b/"):
            yield from ((method, route.path) for method in route.methods - {"HEAD"})


def test_every_e2b_route_refuses_another_tenant_and_another_token(service: Running, sandbox: Sandbox) -> None:
    served = set(_e2b_routes(service.app.routes))
    assert served == set(_ALICES) | _ENVD | set(_OWN), "a route of the E2B API whose tenancy this test does not check"
    bob = {"X-API-KEY": KEYS["bob"]}
    for (method, path), body in _ALICES.items():
        for headers, sandbox_id in ((bob, sandbox.sandbox_id), ({"X-API-KEY": KEYS["alice"]}, "0" * 16)):
            url = service.url + path.format(sandbox_id=sandbox_id)
            answer = httpx.request(method, url, json=body, headers=headers)
            assert (answer.status_code, answer.json()["code"]) == (404, 404), (method, path, answer.text)
    assert Sandbox.kill(sandbox.sandbox_id, **opts(service, "bob")) is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sandbox.sandbox_id, **opts(service, "bob"))
    stranger = httpx.post(f"{service.url}/e2b/sandboxes/{sandbox.sandbox_id}/pause", json={})
    assert stranger.status_code == 401
    theirs = Sandbox.create(**opts(service, "bob"))
    try:
        assert sandbox.sandbox_id not in [s.sandbox_id for s in Sandbox.list(**opts(service, "bob")).next_items()]
        token = theirs.connection_config.sandbox_headers["X-Access-Token"]
        for method, path in sorted(_ENVD):
            url = service.url + path.replace("{rest:path}", "filesystem.Filesystem/WatchDir")
            url = url.replace("{path:path}", "health")
            port = {"E2b-Sandbox-Port": "49999"} if "{path:path}" in path else {}
            for headers in ({}, {"X-Access-Token": token}, {"X-Access-Token": "x.y"}):
                sent = {"E2b-Sandbox-Id": sandbox.sandbox_id, **port, **headers}
                answer = httpx.request(method, url, headers=sent)
                refused = 403 if port and not headers else 401  # a port without a token: E2B's proxy's 403
                assert answer.status_code == refused, (method, path, headers, answer.text)
    finally:
        theirs.kill()
    assert sandbox.commands.run("echo still").stdout == "still\n"


def test_three_environment_variables_are_all_a_program_needs(service: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_API_URL", f"{service.url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{service.url}/e2b/envd")
    monkeypatch.setenv("E2B_API_KEY", KEYS["alice"])
    created = Sandbox.create()
    try:
        assert created.commands.run("echo hi").stdout == "hi\n"
    finally:
        created.kill()


def test_a_malformed_start_ends_its_stream_with_invalid_argument(service: Running, sandbox: Sandbox) -> None:
    headers = {**sandbox.connection_config.sandbox_headers, "Content-Type": "application/connect+json"}
    url = f"{service.url}/e2b/envd/process.Process/Start"
    answer = httpx.post(url, content=b"\x00\x00\x00\x00\x02[]", headers=headers)
    assert answer.status_code == 200
    assert answer.content[0] == 2
    assert json.loads(answer.content[5:])["error"]["code"] == "invalid_argument"


def test_a_commands_output_is_bounded_by_the_services_limit(tmp_path_factory: pytest.TempPathFactory) -> None:
    needs(HAS_BWRAP, "bubblewrap is not installed")
    settings = settings_for(tmp_path_factory.mktemp("e2b-bounded"), max_output_bytes=5000)
    with running(settings) as bounded:
        created = Sandbox.create(**opts(bounded))
        try:
            result = created.commands.run("head -c 200000 /dev/zero | tr '\\0' x; echo; echo done >&2")
            assert len(result.stdout) == 5000  # the first 5000 bytes, the rest not sent
            assert set(result.stdout) == {"x"}
            assert result.exit_code == 0
        finally:
            created.kill()


def test_a_strangers_body_is_never_parsed(service: Running, sandbox: Sandbox) -> None:
    for path in ("/e2b/v2/sandboxes", f"/e2b/sandboxes/{sandbox.sandbox_id}/timeout"):
        refused = httpx.post(service.url + path, content=b"{not json", headers={"Content-Type": "application/json"})
        assert (refused.status_code, refused.json()["code"]) == (401, 401)
        malformed = httpx.post(service.url + path, content=b"{not json", headers={"X-API-KEY": KEYS["alice"]})
        assert (malformed.status_code, malformed.json()["code"]) == (400, 400)


_SLEEPERS = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done 2>/dev/null | grep -cx 'sleep 3[01] '"
"""How many of the background command's sleeps still run (its own line is not one of them)."""


def test_a_background_command_is_listed_and_killed_with_its_tree(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 30 & sleep 31; echo never", background=True)
    listed = {process.pid: process for process in sandbox.commands.list()}
    assert listed[handle.pid].args == ["-l", "-c", "sleep 30 & sleep 31; echo never"]
    assert handle.kill() is True
    with pytest.raises(CommandExitException):
        handle.wait()
    assert handle.pid not in [process.pid for process in sandbox.commands.list()]
    assert sandbox.commands.kill(handle.pid) is False
    with pytest.raises(CommandExitException) as none_left:
        sandbox.commands.run(_SLEEPERS)
    assert none_left.value.stdout == "0\n"
