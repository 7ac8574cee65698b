"""The real E2B SDK, sync and async, over the local jail and Docker, on the envd RPCs beyond a
command's start: the ``files.*`` calls that go over ``filesystem.Filesystem``
(`sandboxes.server.e2b.filesystem`: stat, exists, list with a depth, make_dir, rename and
remove, E2B's errors, and paths that would be shell syntax if ever pasted into a command), and
``commands.connect(pid)``, a running command reattached from several connections."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    CommandExitException,
    FileNotFoundException,
    FileType,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
)
from e2b_harness import opts, service_fixture
from native_writes import helper_client
from service_harness import Running, running, settings_for
from support import HAS_BWRAP, needs

HOSTILE = 'a b\'$(touch pwned)`touch pwned2`;"x"\n*'
"""A name every shell would read as syntax; it must arrive as a name and nothing else."""


service = service_fixture("e2bfs")


@pytest.fixture(scope="module")
def sandbox(service: Running) -> Iterator[Sandbox]:
    created = Sandbox.create(timeout=3600, **opts(service))  # the module's life, past the 300 s default
    yield created
    created.kill()


def test_stat_and_exists_describe_files_directories_and_missing_paths(sandbox: Sandbox) -> None:
    sandbox.files.write("/tmp/st/one.txt", "12345")
    info = sandbox.files.get_info("/tmp/st/one.txt")
    assert (info.name, info.type, info.path, info.size) == ("one.txt", FileType.FILE, "/tmp/st/one.txt", 5)
    assert info.permissions.startswith("-rw")
    assert info.mode & 0o600 == 0o600
    assert info.owner
    assert info.group
    assert info.modified_time.year >= 2024
    assert sandbox.files.get_info("/tmp/st").type == FileType.DIR
    assert sandbox.files.exists("/tmp/st/one.txt")
    assert sandbox.files.exists("/tmp/st")
    assert not sandbox.files.exists("/tmp/st/none")
    assert not sandbox.files.exists("/tmp/st/one.txt/below")
    with pytest.raises(FileNotFoundException):
        sandbox.files.get_info("/tmp/st/none")
    sandbox.commands.run("ln -s one.txt /tmp/st/link")
    link = sandbox.files.get_info("/tmp/st/link")
    assert (link.type, link.symlink_target) == (FileType.FILE, "/tmp/st/one.txt")  # envd's: what it resolves to


def test_list_goes_as_deep_as_asked(service: Running, sandbox: Sandbox) -> None:
    """Each listing answered by the sandbox's exec helper itself (its ``list_dir``: no process)."""
    mux = helper_client(service.registry._entries[sandbox.sandbox_id].sandbox)
    before = mux.native_answers
    sandbox.files.write_files([{"path": "/tmp/ls/a/b/deep.txt", "data": "x"}, {"path": "/tmp/ls/top.txt", "data": "y"}])
    shallow = {(e.path, e.type) for e in sandbox.files.list("/tmp/ls")}
    assert shallow == {("/tmp/ls/a", FileType.DIR), ("/tmp/ls/top.txt", FileType.FILE)}
    assert {e.path for e in sandbox.files.list("/tmp/ls", depth=2)} == {"/tmp/ls/a", "/tmp/ls/top.txt", "/tmp/ls/a/b"}
    assert {e.name for e in sandbox.files.list("/tmp/ls", depth=5)} == {"a", "top.txt", "b", "deep.txt"}
    with pytest.raises(FileNotFoundException):
        sandbox.files.list("/tmp/ls/none")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.list("/tmp/ls/top.txt")
    assert mux.native_answers == before + 1 + 5 + 3  # the upload, every listing, each found one's metadata


def test_make_dir_rename_and_remove(sandbox: Sandbox) -> None:
    assert sandbox.files.make_dir("/tmp/mk/x/y") is True
    assert sandbox.files.make_dir("/tmp/mk/x/y") is False
    sandbox.files.write("/tmp/mk/x/y/f.txt", "moved")
    renamed = sandbox.files.rename("/tmp/mk/x/y/f.txt", "/tmp/mk/elsewhere/g.txt")
    assert (renamed.path, renamed.name, renamed.type, renamed.size) == (
        "/tmp/mk/elsewhere/g.txt",
        "g.txt",
        FileType.FILE,
        5,
    )
    assert sandbox.files.read("/tmp/mk/elsewhere/g.txt") == "moved"
    assert not sandbox.files.exists("/tmp/mk/x/y/f.txt")
    with pytest.raises(FileNotFoundException):
        sandbox.files.rename("/tmp/mk/none", "/tmp/mk/other")
    sandbox.files.remove("/tmp/mk/x")
    assert not sandbox.files.exists("/tmp/mk/x")
    sandbox.files.remove("/tmp/mk/x")  # already gone: no error, as envd's RemoveAll


def test_hostile_names_are_names(sandbox: Sandbox) -> None:
    directory = "/tmp/hostile"
    path = f"{directory}/{HOSTILE}"
    assert sandbox.files.make_dir(path) is True
    assert [e.name for e in sandbox.files.list(directory)] == [HOSTILE]
    assert sandbox.files.get_info(path).name == HOSTILE
    assert sandbox.files.rename(path, f"{path}2").name == f"{HOSTILE}2"
    sandbox.files.remove(f"{path}2")
    assert sandbox.files.list(directory) == []
    for cwd in (directory, "/tmp", sandbox.commands.run("pwd").stdout.strip()):
        assert not sandbox.files.exists(f"{cwd}/pwned")
        assert not sandbox.files.exists(f"{cwd}/pwned2")


async def test_the_async_sdk_reaches_the_same_rpcs(service: Running) -> None:
    created = await AsyncSandbox.create(**opts(service))
    try:
        assert await created.files.make_dir("d/e") is True
        await created.files.write("d/e/f.txt", "abc")
        assert [(e.name, e.size) for e in await created.files.list("d", depth=2) if e.type == FileType.FILE] == [
            ("f.txt", 3)
        ]
        assert (await created.files.rename("d/e/f.txt", "d/g.txt")).path.endswith("/d/g.txt")
        assert (await created.files.get_info("d/g.txt")).size == 3
        await created.files.remove("d")
        assert not await created.files.exists("d")
        with pytest.raises(FileNotFoundException):
            await created.files.get_info("d/g.txt")
    finally:
        await created.kill()


_GATED = "echo first; while [ ! -e {gate} ]; do sleep 0.05; done; echo second; echo late >&2; exit 4"
"""A background command that says ``first``, then waits for the test to create ``gate`` (the
command polls, the test does not), then says ``second`` and fails with 4."""


def test_a_background_command_is_reattached_by_pid_from_several_connections(sandbox: Sandbox) -> None:
    gate = f"/tmp/gate-{uuid.uuid4().hex[:8]}"
    handle = sandbox.commands.run(_GATED.format(gate=gate), background=True)
    again = sandbox.commands.connect(handle.pid)
    twice = sandbox.commands.connect(handle.pid)
    assert again.pid == handle.pid
    sandbox.files.write(gate, "")
    for attached in (again, twice, handle):
        with pytest.raises(CommandExitException) as failed:
            attached.wait()
        assert failed.value.exit_code == 4
        assert failed.value.stdout.endswith("second\n")
        assert failed.value.stderr == "late\n"
    assert handle.pid not in [process.pid for process in sandbox.commands.list()]
    with pytest.raises(NotFoundException):
        sandbox.commands.connect(handle.pid)
    with pytest.raises(NotFoundException):
        sandbox.commands.connect(999_999)
    running = sandbox.commands.run("sleep 30", background=True)
    assert running.kill() is True


async def test_the_async_sdk_reattaches_and_kills(service: Running) -> None:
    created = await AsyncSandbox.create(**opts(service))
    try:
        gate = f"/tmp/gate-{uuid.uuid4().hex[:8]}"
        handle = await created.commands.run(_GATED.format(gate=gate), background=True)
        seen: list[str] = []
        attached = await created.commands.connect(handle.pid, on_stdout=seen.append)
        await created.files.write(gate, "")
        with pytest.raises(CommandExitException) as failed:
            await attached.wait()
        assert failed.value.exit_code == 4
        assert "".join(seen).endswith("second\n")
        sleeper = await created.commands.run("sleep 30", background=True)
        watcher = await created.commands.connect(sleeper.pid)
        assert await created.commands.kill(sleeper.pid) is True
        with pytest.raises(CommandExitException):
            await watcher.wait()
    finally:
        await created.kill()


def test_access_tokens_survive_a_restart_of_the_service(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ``SANDBOXES_E2B_TOKEN_SECRET``, a token handed out before a restart still opens
    the sandbox's envd after it (the secret is kept in the data directory)."""
    needs(HAS_BWRAP, "bubblewrap is not installed")
    monkeypatch.delenv("SANDBOXES_E2B_TOKEN_SECRET", raising=False)
    settings = settings_for(tmp_path_factory.mktemp("e2b-restart"))
    with running(settings) as first:
        created = Sandbox.create(timeout=600, **opts(first))
        token = created.connection_config.sandbox_headers["X-Access-Token"]
    with running(settings) as second:
        headers = {"E2b-Sandbox-Id": created.sandbox_id, "X-Access-Token": token}
        assert httpx.get(f"{second.url}/e2b/envd/health", headers=headers).status_code == 204
        again = Sandbox.connect(created.sandbox_id, **opts(second))
        try:
            assert again.connection_config.sandbox_headers["X-Access-Token"] == token
            assert again.commands.run("echo back").stdout == "back\n"
        finally:
            again.kill()


def test_multipart_uploads_name_their_files_and_malformed_ones_are_refused(service: Running, sandbox: Sandbox) -> None:
    url = f"{service.url}/e2b/envd/files"
    headers = sandbox.connection_config.sandbox_headers | {"E2b-Sandbox-Id": sandbox.sandbox_id}
    files = [("file", ("/tmp/mp/one.txt", b"1")), ("file", ("/tmp/mp/two.bin", b"\x00\xff"))]
    written = httpx.post(url, files=files, headers=headers)
    assert [entry["path"] for entry in written.json()] == ["/tmp/mp/one.txt", "/tmp/mp/two.bin"]
    assert bytes(sandbox.files.read("/tmp/mp/two.bin", format="bytes")) == b"\x00\xff"
    nameless = [("file", (None, b"no filename"))]
    plain = httpx.post(url, params={"path": "/tmp/mp/plain.txt"}, files=nameless, headers=headers)
    assert plain.status_code == 200, plain.text
    assert sandbox.files.read("/tmp/mp/plain.txt") == "no filename"
    both = httpx.post(url, params={"path": "/tmp/mp/x"}, files=files, headers=headers)
    assert (both.status_code, both.json()["code"]) == (400, 400)
    broken = {**headers, "Content-Type": "multipart/form-data; boundary=xyz"}
    refused = httpx.post(url, content=b"--xyz\r\nContent-Disposition: form-data; name=file", headers=broken)
    assert (refused.status_code, refused.json()["code"]) == (400, 400)
    unnamed = httpx.post(url, files=[("file", ("", b"data"))], headers=headers)
    assert (unnamed.status_code, unnamed.json()["code"]) == (400, 400)
