"""`sandboxes.server.streamed` alone: what a streamed command keeps for re-attaching, and how
much of it the service holds."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from sandboxes.api import ExecuteResult
from sandboxes.server.errors import ServiceError
from sandboxes.server.streamed import Replay, StreamedCommand, StreamedCommands


def test_replay_keeps_head_and_tail_by_absolute_offset() -> None:
    replay = Replay(10)  # head 5, tail at least 5
    for chunk in (b"abc", b"defgh", b"ijklmnopqrstuvwxyz"):
        replay.write(chunk)
    assert replay.total == 26
    assert replay.read(0, 100) == (0, b"abcde")
    assert replay.read(3, 1) == (3, b"d")
    start, tail = replay.read(5, 100)  # the middle is gone: the read skips to what is kept
    assert start + len(tail) == 26
    assert b"abcdefghijklmnopqrstuvwxyz".endswith(tail)
    assert len(tail) >= 5
    assert replay.read(26, 100) == (26, b"")
    replay.compact()
    assert replay.read(5, 100) == (21, b"vwxyz")
    assert replay.kept == 10


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _ended(loop: asyncio.AbstractEventLoop, sandbox_id: str, output: bytes) -> StreamedCommand:
    command = StreamedCommand(sandbox_id, 1 << 20, loop)
    command.write(output)
    command.finish(ExecuteResult(output=output.decode(), exit_code=0))
    return command


def test_ended_commands_are_kept_within_a_count_and_a_byte_budget(loop: asyncio.AbstractEventLoop) -> None:
    kept = StreamedCommands(keep=2, keep_bytes=10_000, record_bytes=0)
    first, second, third = (_ended(loop, "a", b"x" * 100) for _ in range(3))
    for command in (first, second, third):
        kept.add(command)
    kept.add(StreamedCommand("a", 100, loop))  # a running one never counts, and prunes the rest
    with pytest.raises(ServiceError) as gone:
        kept.find("a", first.id)
    assert gone.value.code == "not_found"
    assert kept.find("a", second.id) is second
    assert kept.find("a", third.id) is third
    big = _ended(loop, "b", b"y" * 4_950)  # 9,900 held with its text: with the older ones, over budget
    kept.add(big)
    kept.add(StreamedCommand("b", 100, loop))
    assert kept.find("b", big.id) is big
    for old in (second, third):
        with pytest.raises(ServiceError):
            kept.find("a", old.id)


def test_ended_commands_without_output_are_bounded_too(loop: asyncio.AbstractEventLoop) -> None:
    """Each record costs something, output or not: sandboxes made, used and deleted one after
    another do not pile up records (each sorted at every add) for `KEEP_FOR`."""
    kept = StreamedCommands(keep_bytes=1 << 20)
    first = _ended(loop, "sandbox-0", b"")
    kept.add(first)
    for n in range(1, 2_000):
        kept.add(_ended(loop, f"sandbox-{n}", b""))
    with pytest.raises(ServiceError) as gone:
        kept.find("sandbox-0", first.id)
    assert gone.value.code == "not_found"
