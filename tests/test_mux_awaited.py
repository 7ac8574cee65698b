"""`sandboxes._mux._awaited.arun`, commands awaited on an event loop, over a local pipe to the
real helper process (no container): their requests leave together (`sandboxes._mux._outbox`),
and the resend and kill rules hold."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mux_faults import FaultyStream
from test_mux import _VARIANTS, _PipeStream

from sandboxes import protocol as p
from sandboxes._mux import Command, MuxBroken, MuxClient
from sandboxes._mux import client as client_module
from sandboxes._mux._awaited import arun


@pytest.fixture(params=list(_VARIANTS))
def stream(request: pytest.FixtureRequest) -> Iterator[_PipeStream]:
    pipe = _PipeStream(_VARIANTS[request.param])
    yield pipe
    pipe.close()


class _CountingStream:
    """A real stream that counts the writes carrying requests (R frames)."""

    def __init__(self, inner: _PipeStream | FaultyStream) -> None:
        self.inner = inner
        self.request_writes = 0
        self.kinds: list[bytes] = []
        """The kind of each write's first frame."""

    def send(self, data: bytes) -> None:
        self.kinds.append(data[:1])
        if data[:1] == b"R":
            self.request_writes += 1
        self.inner.send(data)

    def recv(self, size: int) -> bytes:
        return self.inner.recv(size)

    def close(self) -> None:
        self.inner.close()


async def _arun(client: MuxClient, command: str) -> p.ExecuteResponse:
    return await arun(client, Command(command, timeout=10, output_limit=1 << 20))


async def test_requests_awaited_in_one_turn_of_the_loop_leave_in_one_write(stream: _PipeStream) -> None:
    counting = _CountingStream(stream)
    client = MuxClient(counting)
    results = await asyncio.gather(*(_arun(client, f"echo {n}") for n in range(10)))
    assert [r.output for r in results] == [f"{n}\n" for n in range(10)]
    assert counting.request_writes == 1
    with_stdin = await arun(client, Command("cat", timeout=10, output_limit=100, stdin=b"in"))
    assert with_stdin.output == "in"  # written at once, its stdin after it


async def test_an_awaited_request_not_written_whole_is_resendable_and_never_runs(
    stream: _PipeStream, tmp_path: Path
) -> None:
    faulty = FaultyStream(stream)
    client = MuxClient(faulty)
    assert (await _arun(client, "echo warm")).output == "warm\n"
    faulty.fail_next_request()
    with pytest.raises(MuxBroken) as broken:
        await _arun(client, f"echo ran >> {tmp_path / 'ran'}")
    assert broken.value.may_resend is True
    assert faulty.sends_after_failure == 0
    assert stream.process.stdin is not None
    stream.process.stdin.close()  # the helper holds half a request: its input ends there
    assert stream.process.wait(timeout=10) == 0
    assert not (tmp_path / "ran").exists()


async def test_requests_of_a_failed_shared_write_may_have_run_so_none_is_resent(stream: _PipeStream) -> None:
    """Half of a write of three requests went out: the first may be whole in the helper, and
    which ones are is unknown, so none of them may be sent again."""
    faulty = FaultyStream(stream)
    client = MuxClient(faulty)
    faulty.fail_next_request()
    outcomes = await asyncio.gather(*(_arun(client, "true") for _ in range(3)), return_exceptions=True)
    assert all(isinstance(o, MuxBroken) and not o.may_resend for o in outcomes), outcomes
    assert faulty.sends_after_failure == 0


async def test_a_kill_never_overtakes_the_request_it_kills(stream: _PipeStream) -> None:
    """The request still waits for the end of the loop's turn when a kill of its command comes
    (a client that left at once): the kill goes out after it, so the command dies, instead of
    being ignored by a helper that does not know the command yet and running to its end."""
    client = MuxClient(stream)
    task = asyncio.create_task(arun(client, Command("sleep 60", timeout=120, output_limit=100, env={"TAG": "t"})))
    await asyncio.sleep(0)  # the task's first step: its request is queued, not written yet
    assert client._outbox._queued, "precondition: the request is still queued"
    assert client.kill_tagged("TAG", "t") == 1
    result = await asyncio.wait_for(task, 20)
    assert result.exit_code == 137, result


async def test_an_unacknowledged_awaited_command_breaks_the_stream_and_is_never_resent(
    stream: _PipeStream, tmp_path: Path
) -> None:
    """As `test_mux`'s thread-path twin: the helper stops (SIGSTOP) before acknowledging; the
    awaited command gives up after the acknowledgement timeout, not resendable, and runs once
    the helper goes on."""
    client = MuxClient(stream, ack_timeout=1.0)
    assert (await _arun(client, "echo warm")).output == "warm\n"
    ran = tmp_path / "ran"
    os.kill(stream.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(MuxBroken) as broken:
            await _arun(client, f"echo ran >> {ran}")
        assert broken.value.may_resend is False
        assert 1.0 <= time.monotonic() - started < 5
        assert not client.alive
    finally:
        os.kill(stream.process.pid, signal.SIGCONT)
    deadline = time.monotonic() + 10
    while not (ran.exists() and ran.read_text().endswith("\n")):  # `>>` creates it before `echo` writes
        assert time.monotonic() < deadline, "the written request never ran"
        await asyncio.sleep(0.02)
    assert ran.read_text() == "ran\n"


async def test_an_awaited_command_not_reported_after_its_timeout_is_killed_then_given_up(
    stream: _PipeStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acknowledged, then the helper stops answering: past its timeout and a grace the client
    sends a kill, and past another grace it breaks the stream instead of waiting forever."""
    monkeypatch.setattr(client_module, "KILL_GRACE", 0.5)
    recording = _CountingStream(stream)
    client = MuxClient(recording)
    task = asyncio.create_task(arun(client, Command("sleep 60", timeout=0.5, output_limit=100)))
    deadline = time.monotonic() + 10
    while not any(item.accepted_at for item in client._pending.values()):
        assert time.monotonic() < deadline, "never acknowledged"
        await asyncio.sleep(0.01)
    os.kill(stream.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(MuxBroken):
            await asyncio.wait_for(task, 10)
        assert 0.9 <= time.monotonic() - started < 5  # the timeout and two graces, at most
        assert recording.kinds[-1] == b"K"
        assert not client.alive
    finally:
        os.kill(stream.process.pid, signal.SIGCONT)
