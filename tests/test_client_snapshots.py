"""Snapshots and forks through the client (sync and async) and the CLI, against the real
service on the local jail: a snapshot taken, listed, restored into a new sandbox and deleted; a
fork's sandboxes with the files; ``sandboxes snapshot|snapshots|snapshot-rm|fork`` and
``create --snapshot``."""

from __future__ import annotations

import asyncio
import io
import sys
from collections.abc import Iterator

import pytest
from server.service_harness import KEYS, Running, running, settings_for
from support import HAS_BWRAP

from sandboxes.cli import main
from sandboxes.client import AsyncSandboxClient, SandboxClient

pytestmark = pytest.mark.needs(HAS_BWRAP, "the local backend needs bubblewrap")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with running(settings_for(tmp_path_factory.mktemp("client-snapshots"))) as svc:
        yield svc


def test_snapshot_restore_and_fork_through_the_sync_client(service: Running) -> None:
    with SandboxClient(service.url, KEYS["alice"]) as client, client.create() as sandbox:
        sandbox.write(f"{sandbox.workdir}/notes.txt", "kept\n")
        taken = sandbox.snapshot()
        assert (taken.sandbox_id, taken.files, taken.paths) == (sandbox.id, 1, [sandbox.workdir])
        assert [info.id for info in client.list_snapshots()] == [taken.id]
        assert client.get_snapshot(taken.id).bytes == taken.bytes
        with client.create(snapshot=taken.id) as restored:
            assert restored.execute("cat notes.txt").output == "kept\n"
        forked = sandbox.fork(2)
        try:
            assert [child.execute("cat notes.txt").output for child in forked] == ["kept\n", "kept\n"]
        finally:
            for child in forked:
                child.destroy()
        for info in client.list_snapshots():
            client.delete_snapshot(info.id)
        assert client.list_snapshots() == []


def test_snapshot_and_fork_through_the_async_client(service: Running) -> None:
    async def run() -> None:
        async with AsyncSandboxClient(service.url, KEYS["alice"]) as client:
            sandbox = await client.create()
            try:
                await sandbox.awrite(f"{sandbox.workdir}/a.txt", "async\n")
                taken = await sandbox.asnapshot()
                restored = await client.create(snapshot=taken.id)
                forked = await sandbox.afork(1)
                for made in (restored, *forked):
                    assert (await made.aexecute("cat a.txt")).output == "async\n"
                    await made.adestroy()
                await client.delete_snapshot(taken.id)
            finally:
                await sandbox.adestroy()

    asyncio.run(run())


def _cli(service: Running, *args: str) -> str:
    streams = [io.TextIOWrapper(io.BytesIO(), encoding="utf-8") for _ in range(2)]
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = streams
    try:
        code = main(["--url", service.url, "--api-key", KEYS["bob"], *args])
    finally:
        sys.stdout, sys.stderr = saved
    for stream in streams:
        stream.flush()
    out, err = (stream.buffer.getvalue().decode() for stream in streams)  # type: ignore[attr-defined]
    assert code == 0, (args, err)
    return out


def test_the_cli_snapshots_restores_and_forks(service: Running) -> None:
    sandbox_id = _cli(service, "create").strip()
    _cli(service, "exec", "--sandbox", sandbox_id, "echo cli > f.txt")
    snapshot_id = _cli(service, "snapshot", sandbox_id).strip()
    assert _cli(service, "snapshots").split() == [snapshot_id]
    assert _cli(service, "snapshots", "-l").split()[:2] == [snapshot_id, sandbox_id]
    restored = _cli(service, "create", "--snapshot", snapshot_id).strip()
    forked = _cli(service, "fork", sandbox_id, "--count", "2").split()
    assert len(forked) == 2
    for made in (restored, *forked):
        assert _cli(service, "exec", "--sandbox", made, "cat f.txt") == "cli\n"
    _cli(service, "snapshot-rm", *_cli(service, "snapshots").split())
    assert _cli(service, "snapshots") == ""
    _cli(service, "rm", sandbox_id, restored, *forked)
