"""`sandboxes.server.streamed` alone: what a streamed command keeps for re-attaching, and how
much of it the service holds."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from sandboxes.api import ExecuteResult
from sandboxes.server import streamed
from sandboxes.server.errors import ServiceError
from sandboxes.server.streamed import Replay, StreamedCommand, StreamedCommands, stream_events


def test_replay_keeps_head_and_tail_by_absolute_offset() -> None:
    replay = Replay(10)  # head 5, tail at least 5
    for chunk in (b"abc", b"defgh", b"ijklmnopqrstuvwxyz"):
        replay.write(chunk)
    assert replay.total == 26
    assert replay.read(0, 100) == (0, b"abcde", "merged")
    assert replay.read(3, 1) == (3, b"d", "merged")
    start, tail, _ = replay.read(5, 100)  # the middle is gone: the read skips to what is kept
    assert start + len(tail) == 26
    assert b"abcdefghijklmnopqrstuvwxyz".endswith(tail)
    assert len(tail) >= 5
    assert replay.read(26, 100)[:2] == (26, b"")
    replay.compact()
    assert replay.read(5, 100) == (21, b"vwxyz", "merged")
    assert replay.kept == 10 + 9  # one run, of one stream


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


def test_replay_keeps_which_stream_each_kept_byte_came_from() -> None:
    replay = Replay(10)  # head 5, tail at least 5
    for chunk, stream in ((b"ab", "stdout"), (b"cd", "stderr"), (b"efgh", "stdout"), (b"ij" * 20, "stderr")):
        replay.write(chunk, stream)  # type: ignore[arg-type]
    replay.write(b"xyz", "stdout")
    assert replay.read(0, 100) == (0, b"ab", "stdout")  # a read stops where the stream changes
    assert replay.read(2, 100) == (2, b"cd", "stderr")
    assert replay.read(4, 100) == (4, b"e", "stdout")  # the head ends there
    start, data, stream = replay.read(5, 100)  # the middle is gone
    assert stream == "stderr"
    assert start + len(data) == 48
    assert (b"ij" * 20).endswith(data)
    assert replay.read(48, 100) == (48, b"xyz", "stdout")
    assert replay.runs <= 5


def test_replay_runs_are_bounded_however_often_the_streams_alternate() -> None:
    replay = Replay(1 << 20)
    for n in range(3 * streamed.MAX_SEGMENTS):
        replay.write(b"x", "stdout" if n % 2 else "stderr")
    assert replay.runs == streamed.MAX_SEGMENTS + 1  # then one merged run
    assert replay.read(3 * streamed.MAX_SEGMENTS - 1, 10)[2] == "merged"


def _lines(command: StreamedCommand, offset: int, loop: asyncio.AbstractEventLoop) -> list[dict[str, Any]]:
    async def read() -> list[dict[str, Any]]:
        return [json.loads(line) async for line in stream_events(command, offset, 60.0)]

    return loop.run_until_complete(read())


def test_events_say_which_stream_their_text_came_from(loop: asyncio.AbstractEventLoop) -> None:
    """Stdout's events keep the shape they had (no ``stream``); stderr's and those of a backend
    that merged them say so; a character cut where the other stream began is not carried over."""
    command = StreamedCommand("a", 1 << 20, loop)
    command.write(b"out\n", "stdout")
    command.write(b"err\n", "stderr")
    command.write(b"cut \xc3", "stdout")
    command.write(b"\xa9", "merged")
    command.finish(ExecuteResult(output="", exit_code=0))
    lines = _lines(command, 0, loop)
    outputs = [(line["data"], line.get("stream"), line["offset"]) for line in lines if line.get("data")]
    assert outputs == [
        ("out\n", None, 4),
        ("err\n", "stderr", 8),
        ("cut ", None, 12),
        ("\ufffd", None, 13),
        ("\ufffd", "merged", 14),
    ]
    assert lines[-1]["type"] == "exit"
    again = _lines(command, 4, loop)  # re-attached: the rest, each with its stream
    assert next((line["data"], line.get("stream")) for line in again if line.get("data")) == ("err\n", "stderr")
