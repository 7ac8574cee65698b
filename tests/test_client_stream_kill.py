"""The client kills a streamed command through the real service: from the stream it reads
(`CommandStream.kill`, `AsyncCommandStream.akill`) or later by its id (`RemoteSandbox.kill_stream`),
the command's whole tree dies and its final response comes back."""

from __future__ import annotations

import asyncio
import shlex
import time
import uuid
from collections.abc import Iterator

import pytest
from server.service_harness import KEYS, Running, running, settings_for

from sandboxes import protocol as p
from sandboxes.client import AsyncSandboxClient, RemoteSandbox, SandboxClient


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with running(settings_for(tmp_path_factory.mktemp("client-stream-kill"))) as svc:
        yield svc


@pytest.fixture(scope="module")
def remote(service: Running) -> Iterator[RemoteSandbox]:
    with SandboxClient(service.url, KEYS["alice"]) as client, client.create() as sandbox:
        yield sandbox


def _loop(marker: str) -> str:
    """A command that prints ``started``, then runs until killed, with a child out of its session."""
    child = shlex.quote(f"sleep 300; echo {marker}")  # the shell stays, the marker in its command line
    return f"echo started; (setsid sh -c {child} &); while :; do sleep 0.05; done"


def _running(remote: RemoteSandbox, marker: str) -> bool:
    """Whether a process runs with ``marker`` in its command line (given on stdin: not in the search's own)."""
    found = remote.execute("grep -lsF -f - /proc/[0-9]*/cmdline; true", stdin=marker)
    return bool(found.output.split())


def _until_gone(remote: RemoteSandbox, marker: str) -> None:
    deadline = time.monotonic() + 10
    while _running(remote, marker):
        assert time.monotonic() < deadline, "the killed command's tree kept running"
        time.sleep(0.05)


def test_a_stream_kills_its_command(remote: RemoteSandbox) -> None:
    marker = f"sbx-{uuid.uuid4().hex}"
    stream = remote.execute_stream(_loop(marker))
    assert next(stream) == "started\n"
    assert _running(remote, marker)
    final = stream.kill()
    assert isinstance(final, p.ExecuteResponse)
    assert final.output == "started\n"
    assert final.exit_code != 0
    _until_gone(remote, marker)
    assert stream.command_id is not None
    assert remote.kill_stream(stream.command_id) == final  # killing it again changes nothing


def test_a_stream_killed_before_it_is_read_never_started(remote: RemoteSandbox) -> None:
    stream = remote.execute_stream("echo never")
    assert stream.kill() is None
    assert list(stream) == []


def test_an_async_stream_kills_its_command(service: Running, remote: RemoteSandbox) -> None:
    marker = f"sbx-{uuid.uuid4().hex}"

    async def scenario() -> p.ExecuteResponse | None:
        async with AsyncSandboxClient(service.url, KEYS["alice"]) as client:
            stream = client.attach(remote.id).aexecute_stream(_loop(marker))
            assert await anext(stream) == "started\n"
            assert await asyncio.to_thread(_running, remote, marker)
            return await stream.akill()

    final = asyncio.run(scenario())
    assert final is not None
    assert (final.output, final.exit_code != 0) == ("started\n", True)
    _until_gone(remote, marker)
