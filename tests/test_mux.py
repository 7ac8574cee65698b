"""The exec helper and its client over a local pipe: the real helper process, no container."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from sandboxes import protocol as p
from sandboxes._mux import SERVER_SOURCE, MuxBroken, MuxClient


class _PipeStream:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER_SOURCE], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )

    def send(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def recv(self, size: int) -> bytes:
        assert self.process.stdout is not None
        return self.process.stdout.read1(size)

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def stream() -> Iterator[_PipeStream]:
    pipe = _PipeStream()
    yield pipe
    pipe.close()


def _run(client: MuxClient, command: str, **overrides: object) -> p.ExecuteResponse:
    options: dict[str, object] = {"timeout": 10, "stdin": None, "env": None, "cwd": None, "output_limit": 1 << 20}
    options.update(overrides)
    return client.run(command, **options)  # type: ignore[arg-type]


def test_commands_run_concurrently_with_stdin_and_exit_codes(stream: _PipeStream) -> None:
    client = MuxClient(stream)
    mixed = _run(client, "echo out; echo err >&2; exit 3")
    assert (mixed.output, mixed.exit_code, mixed.error) == ("out\nerr\n", 3, None)
    result = _run(client, "wc -c", stdin=b"\x00" * 3_000_000)
    assert result.output.strip() == "3000000"
    assert _run(client, "kill -9 $$").exit_code == 137


def test_an_unacknowledged_command_never_started_and_breaks_the_stream(stream: _PipeStream) -> None:
    """A helper that stops answering (SIGSTOP) before acknowledging: the client gives up on the
    stream fast, says the command did not start (so it may go to a fresh helper), and later
    commands fail fast too instead of hanging."""
    client = MuxClient(stream, ack_timeout=1.0)
    assert _run(client, "echo warm").output == "warm\n"
    os.kill(stream.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(MuxBroken) as broken:
            _run(client, "echo never")
        assert broken.value.started is False
        assert time.monotonic() - started < 5
        assert not client.alive
        with pytest.raises(MuxBroken):
            _run(client, "echo after")
    finally:
        os.kill(stream.process.pid, signal.SIGCONT)


def test_a_corrupt_frame_ends_the_stream_instead_of_hanging(stream: _PipeStream) -> None:
    client = MuxClient(stream)
    stream.send(b"Z" + b"\x00" * 8)  # an unknown frame kind: the helper must hang up
    deadline = time.monotonic() + 10
    while client.alive:
        assert time.monotonic() < deadline, "the helper kept waiting on a corrupt stream"
        time.sleep(0.05)
    assert stream.process.wait(timeout=5) == 0


def test_a_stream_that_dies_releases_a_caller_waiting_for_the_acknowledgement(stream: _PipeStream) -> None:
    """The helper dies while a command waits for its acknowledgement: the caller must learn at
    once, not after the acknowledgement timeout."""
    client = MuxClient(stream, ack_timeout=30.0)
    assert _run(client, "echo warm").output == "warm\n"
    os.kill(stream.process.pid, signal.SIGSTOP)  # the next command will not be acknowledged...
    killer = __import__("threading").Timer(0.5, lambda: os.kill(stream.process.pid, signal.SIGKILL))
    killer.start()  # ...and then the stream dies
    started = time.monotonic()
    with pytest.raises(MuxBroken):
        _run(client, "echo never")
    assert time.monotonic() - started < 10
