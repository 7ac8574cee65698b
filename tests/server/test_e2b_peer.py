"""E2B's own SDK test suite (``packages/python-sdk/tests`` of e2b-dev/E2B), its checks that can
run here, against the service over Docker with E2B's ``base`` as E2B runs it (``sandboxes/e2b``:
user ``user`` in ``/home/user``): the real SDK, sync and async, with the defaults a user has.
Each check names the upstream test it comes from; what cannot work here is an ``xfail`` that
says why. One service and one shared sandbox serve most checks."""

from __future__ import annotations

import asyncio
import gzip
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    CommandExitException,
    FilesystemEvent,
    FilesystemEventType,
    FileType,
    InvalidArgumentException,
    NotFoundException,
    RateLimitException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxNotRunningException,
    SandboxState,
)
from e2b_harness import CLEANUP, opts
from service_harness import Running, running, settings_for
from support import SESSION_OWNER, wait_for

from sandboxes.docker import DockerTemplate

E2B_IMAGE = "sandboxes/e2b:latest"
HOME = "/home/user"


@pytest.fixture(scope="module")
def service(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    try:
        docker_client.images.get(E2B_IMAGE)
    except Exception:
        pytest.fail(f"{E2B_IMAGE} is missing: build it with `bash images/build.sh e2b`")
    template = DockerTemplate(backend="docker", image=E2B_IMAGE, workdir=HOME, cpus=0.5, memory="256m", labels=CLEANUP)
    owner = f"{SESSION_OWNER}-e2bpeer-{uuid.uuid4().hex[:6]}"
    settings = settings_for(
        tmp_path_factory.mktemp("e2bpeer"), owner=owner, templates={"e2b": template}, sample_interval=0.5
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SANDBOXES_E2B_TEMPLATES", '{"base": "e2b"}')
        with running(settings, docker_client=docker_client) as svc:
            yield svc


@pytest.fixture(scope="module")
def sandbox(service: Running) -> Iterator[Sandbox]:
    """Created with the SDK's defaults (no timeout: the API's default applies)."""
    created = Sandbox.create(**opts(service))
    yield created
    created.kill()


def _fresh(name: str) -> str:
    return f"{name}_{uuid.uuid4().hex[:8]}"


# --- sandbox lifecycle (sandbox_sync/test_create.py, test_connect.py, test_timeout.py) ---


def test_a_create_without_timeout_lives_e2b_default_and_connect_extends_it(service: Running, sandbox: Sandbox) -> None:
    """test_connect_extends_timeout_on_running_sandbox; E2B's API's default timeout, 300 s."""
    before = sandbox.get_info()
    assert abs((before.end_at - before.started_at).total_seconds() - 300) < 5
    Sandbox.connect(sandbox.sandbox_id, timeout=600, **opts(service))
    after = sandbox.get_info()
    assert after.end_at > before.end_at
    assert abs((after.end_at - datetime.now(UTC)).total_seconds() - 600) < 30
    assert sandbox.is_running()


def test_metrics_come_without_any_command_run(service: Running) -> None:
    """test_metrics.py::test_sbx_metrics: a sandbox's metrics appear on their own."""
    created = Sandbox.create(timeout=60, **opts(service))
    try:
        wait_for(lambda: len(created.get_metrics()) > 0, "no metrics for a sandbox that ran nothing", limit=30)
        metric = created.get_metrics()[0]
        assert metric.cpu_count >= 1
        assert metric.mem_total > 0
        assert metric.disk_total > 0
    finally:
        created.kill()


async def test_a_command_of_a_killed_sandbox_ends_saying_so(service: Running) -> None:
    """sandbox_async/commands/test_sandbox_killed_during_run.py: the SDK's health probe after
    the command's stream broke finds the sandbox gone (it is not adopted back from its
    container's records while its destroy is under way)."""
    created = await AsyncSandbox.create(**opts(service))
    command = await created.commands.run("sleep 60", background=True)
    await created.kill()
    with pytest.raises(SandboxNotRunningException, match="sandbox was killed or reached its end of life"):
        await command.wait()


# --- commands (sandbox_sync/commands/*) ---


def test_commands_run_as_e2b_runs_them(sandbox: Sandbox) -> None:
    """test_run.py, test_env_vars.py: exit codes, envs scoped to one command, cwd, user."""
    assert sandbox.commands.run("echo $FOO", envs={"FOO": "bar"}).stdout.strip() == "bar"
    assert sandbox.commands.run('echo "$FOO"').stdout.strip() == ""
    assert sandbox.commands.run("pwd").stdout.strip() == HOME
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout.strip() == "/tmp"
    assert sandbox.commands.run("whoami").stdout.strip() == "user"
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("exit 7")
    assert failed.value.exit_code == 7


def test_background_commands_are_listed_connected_and_killed(sandbox: Sandbox) -> None:
    """test_cmd_list.py, test_cmd_connect.py, test_cmd_kill.py, test_send_stdin.py."""
    fed = sandbox.commands.run("cat", background=True, stdin=True)
    assert fed.pid in [process.pid for process in sandbox.commands.list()]
    attached = sandbox.commands.connect(fed.pid)  # before the input: what came before is not replayed
    sandbox.commands.send_stdin(fed.pid, "hello\n")
    sandbox.commands.close_stdin(fed.pid)
    assert attached.wait().stdout == "hello\n"
    sleeper = sandbox.commands.run("sleep 60", background=True)
    assert sandbox.commands.kill(sleeper.pid)
    with pytest.raises(CommandExitException):
        sleeper.wait()
    assert sleeper.pid not in [process.pid for process in sandbox.commands.list()]
    assert not sandbox.commands.kill(sleeper.pid)


# --- files (sandbox_sync/files/*) ---


def test_list_walks_depth_first_in_name_order(sandbox: Sandbox) -> None:
    """test_files_list.py::test_list_directory: envd's walk order, depth 1, 2 and 3."""
    parent = _fresh("test_directory")
    for sub in ("subdir1/subdir1_1", "subdir1/subdir1_2", "subdir2/subdir2_1", "subdir2/subdir2_2"):
        sandbox.files.make_dir(f"{parent}/{sub}")
    sandbox.files.write(f"{parent}/file1.txt", "Hello, world!")
    shallow = ["file1.txt", "subdir1", "subdir2"]
    deep = ["file1.txt", "subdir1", "subdir1/subdir1_1", "subdir1/subdir1_2", "subdir2", "subdir2/subdir2_1"]
    deep.append("subdir2/subdir2_2")
    for depth, expected in ((None, shallow), (1, shallow), (2, deep), (3, deep)):
        listed = sandbox.files.list(parent, depth=depth)
        assert [entry.path for entry in listed] == [f"{HOME}/{parent}/{name}" for name in expected]
        assert [entry.type for entry in listed] == [FileType.FILE] + [FileType.DIR] * (len(expected) - 1)
    sandbox.files.remove(parent)


def test_get_info_of_a_symlink_describes_what_it_resolves_to(sandbox: Sandbox) -> None:
    """test_info.py::test_file_symlink."""
    directory = _fresh("test-simlink-entry")
    sandbox.files.write(f"{directory}/test.txt", "Hello, World!")
    sandbox.commands.run("ln -s test.txt symlink_to_test.txt", cwd=directory)
    info = sandbox.files.get_info(f"{directory}/symlink_to_test.txt")
    assert (info.type, info.symlink_target) == (FileType.FILE, f"{HOME}/{directory}/test.txt")
    assert info.name == "symlink_to_test.txt"
    sandbox.commands.run("ln -s nowhere dangling", cwd=directory)
    dangling = sandbox.files.get_info(f"{directory}/dangling")
    assert dangling.symlink_target == f"{HOME}/{directory}/dangling"  # unresolved: the link itself
    sandbox.files.remove(directory)


def test_files_are_written_read_renamed_and_removed(sandbox: Sandbox) -> None:
    """test_write.py, test_read.py, test_exists.py, test_make_dir.py, test_rename.py, test_remove.py."""
    directory = _fresh("files")
    info = sandbox.files.write(f"{directory}/a.txt", "text")
    assert (info.name, info.path) == ("a.txt", f"{HOME}/{directory}/a.txt")
    sandbox.files.write_files([{"path": f"{directory}/b.bin", "data": b"\x00\xff"}])
    assert sandbox.files.read(f"{directory}/a.txt") == "text"
    assert bytes(sandbox.files.read(f"{directory}/b.bin", format="bytes")) == b"\x00\xff"
    assert not sandbox.files.make_dir(directory)  # exists already
    renamed = sandbox.files.rename(f"{directory}/a.txt", f"{directory}/c.txt")
    assert renamed.path == f"{HOME}/{directory}/c.txt"
    assert not sandbox.files.exists(f"{directory}/a.txt")
    with pytest.raises(NotFoundException):
        sandbox.files.read(f"{directory}/a.txt")
    sandbox.files.remove(directory)
    assert not sandbox.files.exists(directory)


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def test_pseudo_files_are_read_and_devices_refused(sandbox: Sandbox) -> None:
    """test_create.py::test_keep_memory_none_defaults_to_full_memory reads ``boot_id``, which
    says it is empty: it reads as ``cat`` prints it, as ``/proc/self/status`` and
    ``/proc/meminfo`` do; a device is refused with E2B's 400 (``InvalidArgumentException``)."""
    assert sandbox.files.read(BOOT_ID) == sandbox.commands.run(f"cat {BOOT_ID}").stdout
    assert sandbox.files.read("/proc/self/status").startswith("Name:\t")
    assert sandbox.files.read("/proc/meminfo").startswith("MemTotal:")
    with pytest.raises(InvalidArgumentException, match="not a regular file"):
        sandbox.files.read("/dev/zero")


def test_boot_id_stays_across_a_pause_and_resume(service: Running) -> None:
    """test_create.py::test_keep_memory_none_defaults_to_full_memory: a pause that keeps the
    memory (a freeze) resumes the same sandbox in place, so its boot id is unchanged."""
    created = Sandbox.create(timeout=60, **opts(service))
    try:
        before = created.files.read(BOOT_ID).strip()
        assert len(before) == 36, before
        assert created.pause()
        assert not created.is_running()
        resumed = Sandbox.connect(created.sandbox_id, **opts(service))
        assert resumed.sandbox_id == created.sandbox_id
        assert resumed.files.read(BOOT_ID).strip() == before
    finally:
        created.kill()


# --- file metadata and gzip (files/test_metadata.py, files/test_content_encoding.py) ---

_XATTR = "import os, sys; print(os.getxattr(sys.argv[1], 'user.e2b.author').decode())"


def test_file_metadata_is_kept_as_user_e2b_xattrs(sandbox: Sandbox) -> None:
    """test_metadata.py: kept on upload (multipart and octet-stream, every file of one), read by
    get_info, list and rename, cleared by an overwrite without it, set out of band alike."""
    directory = _fresh("meta")
    metadata = {"author": "me", "purpose": "upload"}
    assert sandbox.files.write(f"{directory}/a.txt", "x", metadata=metadata).metadata == metadata
    assert sandbox.files.get_info(f"{directory}/a.txt").metadata == metadata
    assert sandbox.commands.run(f'python3 -c "{_XATTR}" {directory}/a.txt').stdout == "me\n"
    octet = sandbox.files.write(f"{directory}/b.txt", "x", metadata={"author": "o"}, use_octet_stream=True)
    assert octet.metadata == {"author": "o"}
    both = sandbox.files.write_files(
        [{"path": f"{directory}/c.txt", "data": "1"}, {"path": f"{directory}/d.txt", "data": "2"}],
        metadata={"tag": "t"},
    )
    assert [info.metadata for info in both] == [{"tag": "t"}] * 2
    listed = {entry.name: entry.metadata for entry in sandbox.files.list(directory)}
    assert listed == {"a.txt": metadata, "b.txt": {"author": "o"}, "c.txt": {"tag": "t"}, "d.txt": {"tag": "t"}}
    assert sandbox.files.rename(f"{directory}/b.txt", f"{directory}/e.txt").metadata == {"author": "o"}
    assert sandbox.files.write(f"{directory}/a.txt", "y").metadata is None
    assert sandbox.files.get_info(f"{directory}/a.txt").metadata is None
    sandbox.commands.run(f"python3 -c \"import os; os.setxattr('{directory}/a.txt', 'user.e2b.k', b'v')\"")
    assert sandbox.files.get_info(f"{directory}/a.txt").metadata == {"k": "v"}
    sandbox.files.remove(directory)


async def test_file_metadata_of_the_async_sdk(service: Running, sandbox: Sandbox) -> None:
    """sandbox_async/files/test_metadata.py."""
    connected = await AsyncSandbox.connect(sandbox.sandbox_id, **opts(service))
    name = _fresh("async_meta") + ".txt"
    assert (await connected.files.write(name, "x", metadata={"author": "a"})).metadata == {"author": "a"}
    assert (await connected.files.get_info(name)).metadata == {"author": "a"}
    await connected.files.remove(name)


def test_a_gzip_upload_is_inflated(service: Running, sandbox: Sandbox) -> None:
    """test_content_encoding.py: ``write(gzip=True)`` sends ``Content-Encoding: gzip``
    (octet-stream, envd 0.5.7); the file holds the inflated bytes. A body inflating past the
    service's body limit, or a broken one, is refused."""
    name = _fresh("gzip") + ".txt"
    sandbox.files.write(name, "zipped " * 100, gzip=True)
    assert sandbox.files.read(name, gzip=True) == "zipped " * 100
    headers = {"X-Access-Token": sandbox._envd_access_token or "", "E2b-Sandbox-Id": sandbox.sandbox_id}
    headers |= {"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}
    url = f"{service.url}/e2b/envd/files"
    written = httpx.post(url, params={"path": name}, headers=headers, content=gzip.compress(b"raw"))
    assert written.status_code == 200, written.text
    assert sandbox.commands.run(f"cat {name}").stdout == "raw"
    bomb = gzip.compress(b"\0" * (service.app.state.service.settings.max_body_bytes + 1))
    assert httpx.post(url, params={"path": name}, headers=headers, content=bomb).status_code == 413
    assert httpx.post(url, params={"path": name}, headers=headers, content=b"not gzip").status_code == 400
    assert sandbox.commands.run(f"cat {name}").stdout == "raw"


# --- watch (sandbox_sync/files/test_watch.py) ---


def _events_until(handle: Any, name: str, kind: FilesystemEventType) -> list[FilesystemEvent]:
    seen: list[FilesystemEvent] = []

    def arrived() -> bool:
        seen.extend(handle.get_new_events())
        return any(event.type == kind and event.name == name for event in seen)

    wait_for(arrived, f"no {kind.value} event for {name}", limit=20)
    return seen


def test_a_watch_sees_a_write_as_envd_writes_in_place(sandbox: Sandbox) -> None:
    """test_watch_iterated, test_watch_directory_changes: a new file's write is ``create``,
    ``chmod`` and ``write`` of that file (no temporary file), an overwrite has a ``write``."""
    directory = _fresh("test_watch_dir_iterated")
    sandbox.files.make_dir(directory)
    handle = sandbox.files.watch_dir(directory)
    try:
        sandbox.files.write(f"{directory}/watched.txt", "This file will be watched.")
        events = _events_until(handle, "watched.txt", FilesystemEventType.WRITE)
        kinds = [FilesystemEventType.CREATE, FilesystemEventType.CHMOD, FilesystemEventType.WRITE]
        assert [(event.name, event.type) for event in events] == [("watched.txt", kind) for kind in kinds]
        sandbox.files.write(f"{directory}/watched.txt", "This file has been modified.")
        again = _events_until(handle, "watched.txt", FilesystemEventType.WRITE)
        assert {event.name for event in again} == {"watched.txt"}
    finally:
        handle.stop()


def test_a_recursive_watch_names_a_nested_write_first_as_its_create(sandbox: Sandbox) -> None:
    """test_watch_recursive_directory_changes."""
    directory = _fresh("test_recursive_watch_dir")
    sandbox.files.make_dir(f"{directory}/nested")
    handle = sandbox.files.watch_dir(directory, recursive=True)
    try:
        sandbox.files.write(f"{directory}/nested/test_watch.txt", "This file will be watched.")
        events = _events_until(handle, "nested/test_watch.txt", FilesystemEventType.WRITE)
        assert len(events) == 3
        assert (events[0].type, events[0].name) == (FilesystemEventType.CREATE, "nested/test_watch.txt")
    finally:
        handle.stop()


def test_a_watch_with_entries_describes_each_file(sandbox: Sandbox) -> None:
    """test_watch_directory_changes_with_entry_info (envd 0.6.3): an event's ``entry`` is its
    file's ``EntryInfo`` (metadata too) while the file is there; a removal has none."""
    directory = _fresh("test_watch_dir_entry")
    sandbox.files.make_dir(directory)
    handle = sandbox.files.watch_dir(directory, include_entry=True)
    try:
        sandbox.files.write(f"{directory}/w.txt", "watched", metadata={"author": "me"})
        written = [event for event in _events_until(handle, "w.txt", FilesystemEventType.WRITE) if event.entry]
        assert written, "no event carried an entry"
        info = written[-1].entry
        assert info is not None
        assert (info.name, info.path, info.type) == ("w.txt", f"{HOME}/{directory}/w.txt", FileType.FILE)
        sandbox.files.remove(f"{directory}/w.txt")
        removed = _events_until(handle, "w.txt", FilesystemEventType.REMOVE)
        assert [event.entry for event in removed if event.type == FilesystemEventType.REMOVE] == [None]
    finally:
        handle.stop()
    plain = sandbox.files.watch_dir(directory)
    try:
        sandbox.files.write(f"{directory}/p.txt", "x")
        assert all(event.entry is None for event in _events_until(plain, "p.txt", FilesystemEventType.WRITE))
    finally:
        plain.stop()


async def _watched_write(
    service: Running, sandbox: Sandbox, name: str, **watch: Any
) -> tuple[list[FilesystemEvent], str]:
    """Through the async SDK: a fresh directory ``name`` watched (``watch``: `watch_dir`'s
    options), ``w.txt`` written in it; the events seen until its write's, and the directory."""
    connected = await AsyncSandbox.connect(sandbox.sandbox_id, **opts(service))
    directory = _fresh(name)
    await connected.files.make_dir(directory)
    seen: list[FilesystemEvent] = []
    written = asyncio.Event()

    def on_event(event: FilesystemEvent) -> None:
        seen.append(event)
        if event.type == FilesystemEventType.WRITE:
            written.set()

    handle = await connected.files.watch_dir(directory, on_event, **watch)
    try:
        await connected.files.write(f"{directory}/w.txt", "x")
        await asyncio.wait_for(written.wait(), 20)
    finally:
        await handle.stop()
    return seen, directory


async def test_the_async_watch_stream_with_entries(service: Running, sandbox: Sandbox) -> None:
    """sandbox_async/files/test_watch.py::test_watch_directory_changes_with_entry_info."""
    seen, directory = await _watched_write(service, sandbox, "async_watch_entry", include_entry=True)
    entry = next(event.entry for event in seen if event.type == FilesystemEventType.WRITE)
    assert entry is not None
    assert (entry.path, entry.type, entry.size) == (f"{HOME}/{directory}/w.txt", FileType.FILE, 1)


async def test_the_async_watch_stream_sees_a_write_as_envd_writes_in_place(service: Running, sandbox: Sandbox) -> None:
    """The async SDK's ``WatchDir`` stream (sandbox_async/files/test_watch.py)."""
    seen, _ = await _watched_write(service, sandbox, "async_watch")
    assert [(event.name, event.type) for event in seen][:3] == [
        ("w.txt", FilesystemEventType.CREATE),
        ("w.txt", FilesystemEventType.CHMOD),
        ("w.txt", FilesystemEventType.WRITE),
    ]


# --- what cannot work here ---


@pytest.mark.xfail(strict=True, raises=CommandExitException, reason="no sudo in E2B's base here (docs/security.md)")
def test_sudo_runs(sandbox: Sandbox) -> None:
    """test_env_vars.py::test_bash_command_scoped_env_vars runs ``sudo echo``."""
    sandbox.commands.run('sudo echo "$FOO"')


# --- snapshots and fork (test_snapshot_api.py, test_fork.py, sync and async) ---


def test_a_snapshot_makes_sandboxes_with_its_files(service: Running, sandbox: Sandbox) -> None:
    """test_snapshot_api.py: a named snapshot, listed (all, of its sandbox, by name), two
    sandboxes made from it (by id and by name), each with its files and on its own, deleted once."""
    name = _fresh("snap")
    sandbox.files.write(f"{HOME}/snap.txt", "from the original")
    snapshot = sandbox.create_snapshot(name=name)
    try:
        assert snapshot.names == [name]
        for query in ({}, {"sandbox_id": sandbox.sandbox_id}, {"name": name}, {"name": f"team/{name}:default"}):
            listed = Sandbox.list_snapshots(**query, **opts(service)).next_items()
            assert snapshot.snapshot_id in [item.snapshot_id for item in listed], query
        assert Sandbox.list_snapshots(name=f"{name}-none", **opts(service)).next_items() == []
        sandbox.files.write(f"{HOME}/snap.txt", "changed after the snapshot")
        first = Sandbox.create(snapshot.snapshot_id, timeout=60, **opts(service))
        second = Sandbox.create(name, timeout=60, **opts(service))
        try:
            first.files.write(f"{HOME}/snap.txt", "changed in the first")
            assert second.files.read(f"{HOME}/snap.txt") == "from the original"
            assert first.files.read(f"{HOME}/snap.txt") == "changed in the first"
            assert first.commands.run("whoami").stdout.strip() == "user"
        finally:
            first.kill()
            second.kill()
    finally:
        assert Sandbox.delete_snapshot(snapshot.snapshot_id, **opts(service)) is True
    assert Sandbox.delete_snapshot(snapshot.snapshot_id, **opts(service)) is False
    with pytest.raises(SandboxException, match="template 'base' is the service's"):
        Sandbox.delete_snapshot("base", **opts(service))
    with pytest.raises(SandboxException, match="files, not its processes"):
        sandbox.create_snapshot(mode="full")  # a memory snapshot: refused, never a files-only one instead


def test_a_fork_has_the_files_and_lives_on_its_own(service: Running, sandbox: Sandbox) -> None:
    """test_fork.py: forks of a running sandbox (its files, their own ids and timeout), which
    runs on; the fork's snapshot is not left behind; a killed sandbox is not found."""
    before = {item.snapshot_id for item in Sandbox.list_snapshots(**opts(service)).next_items()}
    sandbox.files.write(f"{HOME}/state.txt", "state before fork")
    forks = sandbox.fork(count=2, timeout=60)
    made = [fork for fork in forks if isinstance(fork, Sandbox)]
    try:
        assert len(made) == 2, forks
        assert len({fork.sandbox_id for fork in made} | {sandbox.sandbox_id}) == 3
        made[0].files.write(f"{HOME}/state.txt", "modified in fork")
        assert made[1].files.read(f"{HOME}/state.txt") == "state before fork"
        assert sandbox.files.read(f"{HOME}/state.txt") == "state before fork"
        info = made[1].get_info()
        assert abs((info.end_at - info.started_at).total_seconds() - 60) < 5
        assert sandbox.is_running()
    finally:
        for fork in made:
            fork.kill()
    assert {item.snapshot_id for item in Sandbox.list_snapshots(**opts(service)).next_items()} == before
    killed = Sandbox.create(timeout=60, **opts(service))
    killed.kill()
    with pytest.raises(SandboxNotFoundException):
        killed.fork()


async def test_the_async_sdk_snapshots_and_forks(service: Running, sandbox: Sandbox) -> None:
    """sandbox_async/test_snapshot_api.py and test_fork.py."""
    connected = await AsyncSandbox.connect(sandbox.sandbox_id, **opts(service))
    await connected.files.write(f"{HOME}/async-snap.txt", "async")
    snapshot = await connected.create_snapshot()
    try:
        listed = await AsyncSandbox.list_snapshots(sandbox_id=sandbox.sandbox_id, **opts(service)).next_items()
        assert snapshot.snapshot_id in [item.snapshot_id for item in listed]
        made = await AsyncSandbox.create(snapshot.snapshot_id, timeout=60, **opts(service))
        try:
            assert await made.files.read(f"{HOME}/async-snap.txt") == "async"
        finally:
            await made.kill()
    finally:
        assert await AsyncSandbox.delete_snapshot(snapshot.snapshot_id, **opts(service)) is True
    [fork] = await connected.fork(timeout=60)
    assert isinstance(fork, AsyncSandbox)
    try:
        assert await fork.files.read(f"{HOME}/async-snap.txt") == "async"
        assert fork.sandbox_id != sandbox.sandbox_id
    finally:
        await fork.kill()


def test_a_tenants_snapshots_are_its_own(service: Running, sandbox: Sandbox) -> None:
    """Another tenant neither lists, nor makes a sandbox from, nor deletes a tenant's snapshot,
    by id or by name, nor snapshots or forks its sandbox."""
    name = _fresh("mine")
    snapshot = sandbox.create_snapshot(name=name)
    bob = opts(service, "bob")
    try:
        assert Sandbox.list_snapshots(**bob).next_items() == []
        for ref in (snapshot.snapshot_id, name):
            assert Sandbox.list_snapshots(name=ref, **bob).next_items() == []
            with pytest.raises(SandboxException, match="unknown template"):
                Sandbox.create(ref, **bob)
            assert Sandbox.delete_snapshot(ref, **bob) is False
        with pytest.raises(SandboxNotFoundException):
            Sandbox.create_snapshot(sandbox.sandbox_id, **bob)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.fork(sandbox.sandbox_id, **bob)
        listed = Sandbox.list_snapshots(name=name, **opts(service)).next_items()
        assert [item.snapshot_id for item in listed] == [snapshot.snapshot_id]
    finally:
        assert Sandbox.delete_snapshot(snapshot.snapshot_id, **opts(service)) is True


def test_a_hibernated_sandboxs_own_snapshot_is_not_one_of_the_tenants(service: Running) -> None:
    """A filesystem-only pause keeps the files in a snapshot of the sandbox's own: not listed
    (so not deleted from under it), and its resume still finds it."""
    before = {item.snapshot_id for item in Sandbox.list_snapshots(**opts(service)).next_items()}
    created = Sandbox.create(timeout=60, **opts(service))
    try:
        created.files.write(f"{HOME}/kept.txt", "kept")
        assert created.pause(keep_memory=False)
        after = {item.snapshot_id for item in Sandbox.list_snapshots(**opts(service)).next_items()}
        assert after == before
        assert Sandbox.list_snapshots(sandbox_id=created.sandbox_id, **opts(service)).next_items() == []
        resumed = Sandbox.connect(created.sandbox_id, **opts(service))
        assert resumed.files.read(f"{HOME}/kept.txt") == "kept"
    finally:
        created.kill()


def test_a_create_from_a_snapshot_counts_against_the_quota(service: Running) -> None:
    """``tiny`` may have one sandbox: neither a create from a snapshot nor a fork makes a second
    (the fork answers the refusal as its one result); once its sandbox is gone, the snapshot,
    which outlives it, makes one."""
    tiny = opts(service, "tiny")
    only = Sandbox.create(timeout=60, **tiny)
    try:
        only.files.write(f"{HOME}/kept.txt", "kept")
        snapshot = only.create_snapshot()
        with pytest.raises(RateLimitException, match="quota of tenant 'tiny': 1 live sandboxes"):
            Sandbox.create(snapshot.snapshot_id, **tiny)
        [refused] = only.fork()
        assert isinstance(refused, RateLimitException), refused
        assert "quota of tenant 'tiny'" in str(refused)
    finally:
        only.kill()
    try:
        again = Sandbox.create(snapshot.snapshot_id, timeout=60, **tiny)
        try:
            assert again.files.read(f"{HOME}/kept.txt") == "kept"
        finally:
            again.kill()
    finally:
        assert Sandbox.delete_snapshot(snapshot.snapshot_id, **tiny) is True


# --- signed file URLs (sandbox_sync/files/test_secured.py and its async twin) ---


def _fetch(url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """The status and body of a plain request to ``url`` (no header of the SDK's)."""
    headers = ({"Content-Type": "application/octet-stream"} if body else {}) | (headers or {})
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


def _signed_urls_work(service: Running, sandbox: Any, written: str) -> None:
    """A signed URL (the root ``/files`` the SDK builds from ``E2B_SANDBOX_URL``) reads and
    writes without the access token; an expired or altered one is envd's 401."""
    assert sandbox.download_url(written, "user").startswith(f"{service.url}/files?")
    assert _fetch(sandbox.download_url(written, "user")) == (200, b"signed")
    assert _fetch(sandbox.download_url(written, "user", 120)) == (200, b"signed")
    status, body = _fetch(sandbox.download_url(written, "user", use_signature_expiration=-120))
    assert (status, json.loads(body)) == (401, {"code": 401, "message": "signature is already expired"})
    status, body = _fetch(sandbox.download_url(written, "user").replace("signature=v1_", "signature=v1_A"))
    assert (status, json.loads(body)) == (401, {"code": 401, "message": "invalid signature"})
    status, body = _fetch(sandbox.download_url(written, "user").replace(f"path={written}", "path=other.txt"))
    assert (status, json.loads(body)["message"]) == (401, "invalid signature")  # the signature names its path
    assert _fetch(sandbox.upload_url(f"{written}.up", "user", 120), b"uploaded")[0] == 200
    assert _fetch(sandbox.download_url(f"{written}.up", "user"))[1] == b"uploaded"


def test_signed_file_urls_need_no_access_token(service: Running, sandbox: Sandbox) -> None:
    """test_secured.py: ``secure=True``, ``download_url`` with and without expiration, expired;
    a URL signed for one sandbox reads nothing of another's, even naming it."""
    created = Sandbox.create(secure=True, timeout=100, **opts(service))
    try:
        created.files.write("signed.txt", "signed")
        _signed_urls_work(service, created, "signed.txt")
        sandbox.files.write("signed.txt", "other's")
        signed = created.download_url("signed.txt", "user").replace(f"{service.url}/", f"{service.url}/e2b/envd/")
        assert _fetch(signed, headers={"E2b-Sandbox-Id": created.sandbox_id}) == (200, b"signed")
        assert _fetch(signed, headers={"E2b-Sandbox-Id": sandbox.sandbox_id})[0] == 401
    finally:
        created.kill()


async def test_signed_file_urls_of_the_async_sdk(service: Running) -> None:
    """sandbox_async/files/test_secured.py."""
    created = await AsyncSandbox.create(secure=True, timeout=100, **opts(service))
    try:
        await created.files.write("signed.txt", "signed")
        await asyncio.to_thread(_signed_urls_work, service, created, "signed.txt")
    finally:
        await created.kill()


@pytest.mark.xfail(
    strict=True,
    reason="get_host(port) is E2B's host name <port>-<id>.<domain>, which only E2B's DNS resolves; here a "
    "sandbox's ports are reached at E2B_SANDBOX_URL with E2b-Sandbox-Port (test_host.py, test_create.py)",
)
def test_get_host_is_reachable_here(sandbox: Sandbox) -> None:
    assert sandbox.get_host(8000).startswith("127.0.0.1")


def test_a_timeout_pauses_when_asked(service: Running) -> None:
    """test_create.py::test_auto_pause_without_auto_resume_requires_connect."""
    created = Sandbox.create(timeout=1, lifecycle={"on_timeout": "pause", "auto_resume": False}, **opts(service))
    try:
        created.files.write("kept.txt", "kept\n")
        wait_for(lambda: not created.is_running(), "the sandbox outlived its timeout", limit=20)
        assert created.get_info().state == SandboxState.PAUSED
        created.connect()
        assert created.get_info().state == SandboxState.RUNNING
        assert created.files.read("kept.txt") == "kept\n"
    finally:
        Sandbox.kill(created.sandbox_id, **opts(service))


@pytest.mark.xfail(
    strict=True,
    raises=CommandExitException,
    reason="E2B's base has internet access by default; this service's e2b template has no egress "
    "(test_internet_access.py, test_network.py)",
)
def test_internet_access_by_default(sandbox: Sandbox) -> None:
    sandbox.commands.run("curl -sS --max-time 5 -o /dev/null https://example.com")
