"""Pause and resume through the client (sync and async) and the CLI, against the real service
on the local jail: the sandbox's info says ``paused``, an operation on it raises `Paused`,
``auto_resume`` resumes it, and ``sandboxes pause|resume ID`` print its id and state."""

from __future__ import annotations

import asyncio
import io
import sys
from collections.abc import Iterator

import pytest
from server.service_harness import KEYS, Running, running, settings_for
from support import HAS_BWRAP

from sandboxes.cli import main
from sandboxes.client import AsyncSandboxClient, Paused, SandboxClient
from sandboxes.client.errors import OperationFailed

pytestmark = pytest.mark.needs(HAS_BWRAP, "the local backend needs bubblewrap")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with running(settings_for(tmp_path_factory.mktemp("client-pause"))) as svc:
        yield svc


def test_pause_and_resume_through_the_sync_client(service: Running) -> None:
    with SandboxClient(service.url, KEYS["alice"]) as client, client.create() as sandbox:
        assert sandbox.pause(ttl="stop").state == "paused"
        assert sandbox.refresh().state == "paused"
        with pytest.raises(Paused, match="resume it first"):
            sandbox.execute("echo hi")
        with pytest.raises(Paused, match="already paused"):
            client.pause(sandbox.id)
        assert sandbox.resume().state == "running"
        assert sandbox.execute("echo hi").output == "hi\n"


def test_hibernate_through_the_client_says_the_processes_were_not_kept(service: Running) -> None:
    with SandboxClient(service.url, KEYS["alice"]) as client, client.create() as sandbox:
        with pytest.raises(OperationFailed, match="CRIU") as refused:
            sandbox.pause(mode="hibernate", memory=True)
        assert refused.value.code == "unavailable"
        assert sandbox.refresh().state == "running"
        assert sandbox.pause(mode="freeze").processes_kept is True
        assert sandbox.resume().processes_kept is None
        hibernated = sandbox.pause(mode="hibernate")
        assert (hibernated.state, hibernated.processes_kept) == ("paused", False)
        assert sandbox.resume().state == "running"

    async def run() -> None:
        async with AsyncSandboxClient(service.url, KEYS["alice"]) as client:
            sandbox = await client.create()
            try:
                assert (await sandbox.apause(mode="hibernate")).processes_kept is False
                assert (await sandbox.aresume()).state == "running"
            finally:
                await sandbox.adestroy()

    asyncio.run(run())


def test_pause_and_auto_resume_through_the_async_client(service: Running) -> None:
    async def run() -> None:
        async with AsyncSandboxClient(service.url, KEYS["alice"]) as client:
            sandbox = await client.create(auto_resume=True)
            try:
                assert (await sandbox.apause()).state == "paused"
                assert (await sandbox.aexecute("echo awake")).output == "awake\n"
                assert (await sandbox.arefresh()).state == "running"
                await sandbox.apause()
                assert (await sandbox.aresume()).state == "running"
            finally:
                await sandbox.adestroy()

    asyncio.run(run())


def _cli(service: Running, *args: str) -> tuple[int, str, str]:
    streams = [io.TextIOWrapper(io.BytesIO(), encoding="utf-8") for _ in range(2)]
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = streams
    try:
        code = main(["--url", service.url, "--api-key", KEYS["alice"], *args])
    finally:
        sys.stdout, sys.stderr = saved
    for stream in streams:
        stream.flush()
    out, err = (stream.buffer.getvalue().decode() for stream in streams)  # type: ignore[attr-defined]
    return code, out, err


def test_the_cli_pauses_and_resumes(service: Running) -> None:
    code, out, _ = _cli(service, "create")
    sandbox_id = out.strip()
    try:
        assert _cli(service, "pause", sandbox_id, "--ttl", "stop")[:2] == (0, f"{sandbox_id} paused\n")
        code, _, err = _cli(service, "pause", sandbox_id)
        assert code != 0
        assert err.startswith("error: paused: ")
        assert _cli(service, "resume", sandbox_id)[:2] == (0, f"{sandbox_id} running\n")
        code, _, err = _cli(service, "pause", sandbox_id, "--hibernate", "--memory")
        assert (code != 0, err.startswith("error: unavailable: "), "CRIU" in err) == (True, True, True)
        assert _cli(service, "pause", sandbox_id, "--hibernate")[:2] == (0, f"{sandbox_id} paused files-only\n")
        assert _cli(service, "resume", sandbox_id)[:2] == (0, f"{sandbox_id} running\n")
    finally:
        _cli(service, "rm", sandbox_id)
