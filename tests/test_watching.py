"""File watches through `sandboxes.watching` on real sandboxes (a bubblewrap jail, a Docker
container): events as a sync and an async iterator, what the sandbox's user may not list left
out, clear errors; and the watcher's queue, bounded against a flood or a hostile helper."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import SESSION_OWNER

from sandboxes.api import WatchEvent
from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.filesystem import FilesystemBackend
from sandboxes.local import LocalSandbox
from sandboxes.watching import MAX_LINE, Watcher, WatchError, awatch, watch


def _until(watcher: Watcher, wanted: WatchEvent, limit: int = 200) -> list[WatchEvent]:
    """The events up to ``wanted`` (each waited for at most 10 s)."""
    seen = []
    for _ in range(limit):
        event = watcher.get(timeout=10)
        assert event is not None, f"no {wanted} after {seen}"
        seen.append(event)
        if event == wanted:
            return seen
    raise AssertionError(f"no {wanted} in {seen}")


def test_a_jail_is_watched_with_a_sync_iterator(jail: LocalSandbox) -> None:
    root = str(jail.root)
    with watch(jail, root, recursive=True) as watcher:
        assert watcher.method == "inotify"
        jail.execute("mkdir -p sub && echo hi > sub/f.txt")
        _until(watcher, WatchEvent(type="create", name="sub/f.txt"))
        jail.execute("rm sub/f.txt")
        seen = []
        for event in watcher:  # the sync iterator
            seen.append(event)
            if event.type == "remove":
                break
        assert seen[-1] == WatchEvent(type="remove", name="sub/f.txt")
    assert watcher.ended
    assert watcher.error is None


def test_a_jail_is_watched_with_an_async_iterator(jail: LocalSandbox) -> None:
    async def scenario() -> list[WatchEvent]:
        watcher = await awatch(jail, str(jail.root))
        async with watcher:
            await asyncio.to_thread(jail.write, f"{jail.root}/a.txt", "x")
            seen = []
            async for event in watcher:
                seen.append(event)
                if event == WatchEvent(type="create", name="a.txt"):
                    break
            return seen

    assert asyncio.run(asyncio.wait_for(scenario(), 30))[-1] == WatchEvent(type="create", name="a.txt")


def test_a_watch_ends_its_iteration_at_its_timeout(jail: LocalSandbox) -> None:
    watcher = watch(jail, str(jail.root), timeout=0.5)
    assert list(watcher) == []  # ends once the watch does
    assert watcher.error == "timeout"


def test_a_watch_that_cannot_start_says_why(jail: LocalSandbox, tmp_path: Path) -> None:
    with pytest.raises(WatchError) as missing:
        watch(jail, f"{jail.root}/nowhere")
    assert missing.value.code == "file_not_found"
    jail.write(f"{jail.root}/file", "x")
    with pytest.raises(WatchError) as file:
        watch(jail, f"{jail.root}/file")
    assert file.value.code == "not_a_directory"
    with pytest.raises(WatchError) as relative:
        watch(jail, "relative/dir")
    assert relative.value.code == "invalid_path"
    with pytest.raises(WatchError) as no_helper:
        watch(FilesystemBackend(root_dir=tmp_path), str(tmp_path))
    assert no_helper.value.code == "unavailable"
    assert "FilesystemBackend" in no_helper.value.message


@pytest.fixture
def container(docker_client: Any, runtime_image: str) -> Iterator[DockerSandbox]:
    config = DockerSandboxConfig(image=runtime_image, owner=SESSION_OWNER)
    with DockerSandbox.create(config, client=docker_client) as sandbox:
        yield sandbox


def test_a_container_is_watched_and_what_its_user_may_not_list_stays_out(
    container: DockerSandbox, docker_client: Any
) -> None:
    """The helper runs as the sandbox's user (uid 1000): a directory only root may read is not
    entered, and what happens in it is never reported."""
    as_root = docker_client.containers.get(container.id)
    made = as_root.exec_run(["sh", "-c", "mkdir -p /tmp/w/secret && chmod 700 /tmp/w/secret"], user="root")
    assert made.exit_code == 0, made.output
    with watch(container, "/tmp/w", recursive=True) as watcher:
        done = as_root.exec_run(["sh", "-c", "touch /tmp/w/secret/hidden && touch /tmp/w/visible"], user="root")
        assert done.exit_code == 0, done.output
        seen = _until(watcher, WatchEvent(type="create", name="visible"))
        assert all("hidden" not in (event.name or "") for event in seen), seen
    with watch(container, "/workspace", recursive=True) as watcher:
        assert container.execute("mkdir -p /workspace/d && echo x > /workspace/d/f").exit_code == 0
        _until(watcher, WatchEvent(type="create", name="d/f"))
        assert container.execute("mv /workspace/d/f /workspace/g && chmod 600 /workspace/g").exit_code == 0
        seen = _until(watcher, WatchEvent(type="chmod", name="g"))
        assert WatchEvent(type="rename", name="d/f") in seen
        assert WatchEvent(type="create", name="g") in seen


def test_the_queue_is_bounded_and_a_flood_leaves_one_overflow() -> None:
    watcher = Watcher(max_queued=3)
    lines = [json.dumps({"type": "create", "name": f"f{number}"}).encode() for number in range(10)]
    watcher._take(b"\n".join(lines[:4]) + b"\n" + lines[4][:5])  # a line cut between two chunks
    watcher._take(lines[4][5:] + b"\n" + b"\n".join(lines[5:]) + b"\n")
    watcher._end()
    events = list(watcher)
    assert events == [
        *(WatchEvent(type="create", name=f"f{number}") for number in range(3)),
        WatchEvent(type="overflow"),
    ]


def test_hostile_lines_are_bounded_and_dropped_as_overflows() -> None:
    watcher = Watcher()
    watcher._take(b"not json\n" + b'{"type": "explode"}\n')
    for _ in range(4):  # a line longer than the bound, in chunks without an end of line
        watcher._take(b"x" * (MAX_LINE // 2))
    assert len(watcher._partial) <= MAX_LINE  # dropped, not buffered on
    watcher._take(b'{"type": "create", "name": "the end of the long line"}\n{"type": "write", "name": "ok"}\n')
    watcher._end()
    assert list(watcher) == [WatchEvent(type="overflow"), WatchEvent(type="write", name="ok")]
