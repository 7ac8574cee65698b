"""File watching through the E2B-compatible API with the real SDK: the sync SDK's polled watcher
(``CreateWatcher``, ``GetWatcherEvents``, ``RemoveWatcher``) and the async SDK's ``WatchDir``
stream, over the local jail and over Docker."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import AsyncSandbox, FilesystemEvent, FilesystemEventType, NotFoundException, Sandbox, SandboxException
from e2b_harness import opts, service_fixture
from service_harness import Running
from support import wait_for

service = service_fixture("e2b-watch")


@pytest.fixture(scope="module")
def sandbox(service: Running) -> Iterator[Sandbox]:
    created = Sandbox.create(timeout=3600, **opts(service))  # the module's life, past the 300 s default
    yield created
    created.kill()


def test_the_sync_sdk_polls_a_watcher_for_every_kind_of_event(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("polled/nested")
    handle = sandbox.files.watch_dir("polled", recursive=True)
    script = "cd polled/nested && touch f && echo x >> f && chmod 600 f && mv f g && rm g && touch ../last"
    sandbox.commands.run(script)
    seen: list[FilesystemEvent] = []

    def complete() -> bool:
        seen.extend(handle.get_new_events())
        return any(event.name == "last" for event in seen)

    wait_for(complete, "the watcher never reported the last file")
    kinds = {(event.name, event.type) for event in seen}
    assert {
        ("nested/f", FilesystemEventType.CREATE),
        ("nested/f", FilesystemEventType.WRITE),
        ("nested/f", FilesystemEventType.CHMOD),
        ("nested/f", FilesystemEventType.RENAME),
        ("nested/g", FilesystemEventType.CREATE),
        ("nested/g", FilesystemEventType.REMOVE),
        ("last", FilesystemEventType.CREATE),
    } <= kinds
    assert handle.get_new_events() == []  # drained
    handle.stop()
    with pytest.raises(SandboxException):
        handle.get_new_events()


def test_watching_a_file_or_a_missing_directory_fails_as_envd_does(sandbox: Sandbox) -> None:
    sandbox.files.write("plain.txt", "x")
    with pytest.raises(SandboxException) as file:
        sandbox.files.watch_dir("plain.txt")
    assert "not a directory" in str(file.value)
    with pytest.raises(NotFoundException):
        sandbox.files.watch_dir("no/such/dir")


def test_the_async_sdk_streams_events_from_watch_dir(service: Running, sandbox: Sandbox) -> None:
    async def scenario() -> list[FilesystemEvent]:
        remote = await AsyncSandbox.connect(sandbox.sandbox_id, **opts(service))
        await remote.files.make_dir("streamed")
        seen: list[FilesystemEvent] = []
        arrived = asyncio.Event()

        def on_event(event: FilesystemEvent) -> None:
            seen.append(event)
            if event.name == "deep/file.txt" and event.type == FilesystemEventType.CREATE:
                arrived.set()

        handle = await remote.files.watch_dir("streamed", on_event=on_event, recursive=True)
        await remote.files.write("streamed/deep/file.txt", "hello")
        await asyncio.wait_for(arrived.wait(), 20)
        await handle.stop()
        return seen

    seen = asyncio.run(scenario())
    assert ("deep", FilesystemEventType.CREATE) in {(event.name, event.type) for event in seen}


def test_a_stopped_stream_frees_its_watch(service: Running, sandbox: Sandbox) -> None:
    """The tenant's bound counts open watches: a stopped async watch is released (on the
    service's side, once it sees the stream gone)."""
    watches = service.app.state.service.watches

    async def scenario() -> None:
        remote = await AsyncSandbox.connect(sandbox.sandbox_id, **opts(service))
        handle = await remote.files.watch_dir(".", on_event=lambda event: None)
        assert watches._open.get("alice", 0) >= 1
        await handle.stop()

    asyncio.run(scenario())
    wait_for(lambda: watches._open.get("alice", 0) == 0, "a stopped watch still counts against the tenant")


def _envelopes(stream: Iterator[bytes]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Connect envelopes (flags, message) as they arrive."""
    buffer = b""
    for chunk in stream:
        buffer += chunk
        while len(buffer) >= 5 and len(buffer) >= 5 + int.from_bytes(buffer[1:5], "big"):
            end = 5 + int.from_bytes(buffer[1:5], "big")
            yield buffer[0], json.loads(buffer[5:end])
            buffer = buffer[end:]


def test_watch_dir_speaks_envds_json(service: Running, sandbox: Sandbox) -> None:
    """The stream's messages on the wire: ``start``, a ``keepalive`` once quiet for the
    interval the client asked, ``filesystem`` events with envd's enum names, and its deadline
    (``Connect-Timeout-Ms``) ending it with ``deadline_exceeded``."""
    sandbox.files.make_dir("wire")
    headers = {
        **sandbox.connection_config.sandbox_headers,
        "Content-Type": "application/connect+json",
        "Keepalive-Ping-Interval": "1",
        "Connect-Timeout-Ms": "3000",
    }
    body = json.dumps({"path": "wire", "recursive": True}).encode()
    request = b"\x00" + len(body).to_bytes(4, "big") + body
    url = f"{service.url}/e2b/envd/filesystem.Filesystem/WatchDir"
    with httpx.stream("POST", url, content=request, headers=headers, timeout=30) as answer:
        messages = _envelopes(answer.iter_bytes())
        assert next(messages) == (0, {"start": {}})
        assert next(messages) == (0, {"keepalive": {}})
        sandbox.commands.run("touch wire/new")
        assert next(messages) == (0, {"filesystem": {"name": "new", "type": "EVENT_TYPE_CREATE"}})
        rest = list(messages)
    assert rest[-1][0] == 2
    assert rest[-1][1]["error"] == {"code": "deadline_exceeded", "message": "the watch reached its timeout (3 s)"}
    assert all(
        message in ({"keepalive": {}}, {"filesystem": {"name": "new", "type": "EVENT_TYPE_CHMOD"}})
        for _, message in rest[:-1]
    ), rest  # touch sets its times: CHMOD, as envd says


def test_a_watch_may_allow_network_mounts(service: Running, sandbox: Sandbox) -> None:
    """envd 0.6.4's ``allow_network_mounts`` (E2B's
    ``test_watch_directory_changes_with_network_mounts_allowed``, sync and async): the SDK sends
    it (on envd 0.6.3 it refused it itself) and the watch reports as without it; a flag that is
    not a boolean is envd's ``invalid_argument``."""
    sandbox.files.make_dir("mounts")
    assert sandbox.get_info().envd_version == "0.6.4"
    polled = sandbox.files.watch_dir("mounts", allow_network_mounts=True)
    sandbox.files.write("mounts/polled.txt", "x")
    seen: list[FilesystemEvent] = []

    def written() -> bool:
        seen.extend(polled.get_new_events())
        return ("polled.txt", FilesystemEventType.WRITE) in {(event.name, event.type) for event in seen}

    wait_for(written, "the polled watcher allowing network mounts reported no write")
    polled.stop()

    async def streamed() -> None:
        remote = await AsyncSandbox.connect(sandbox.sandbox_id, **opts(service))
        arrived = asyncio.Event()

        def on_event(event: FilesystemEvent) -> None:
            if (event.name, event.type) == ("streamed.txt", FilesystemEventType.WRITE):
                arrived.set()

        handle = await remote.files.watch_dir("mounts", on_event=on_event, allow_network_mounts=True)
        await remote.files.write("mounts/streamed.txt", "x")
        await asyncio.wait_for(arrived.wait(), 20)
        await handle.stop()

    asyncio.run(streamed())
    headers = {**sandbox.connection_config.sandbox_headers, "Content-Type": "application/json"}
    url = f"{service.url}/e2b/envd/filesystem.Filesystem/CreateWatcher"
    refused = httpx.post(url, json={"path": "mounts", "allowNetworkMounts": "yes"}, headers=headers, timeout=30)
    assert refused.status_code == 400, refused.text
    assert refused.json()["code"] == "invalid_argument"
