"""A channel (`sandboxes._mux.open_channel`): a command whose stdin stays open and whose output
arrives as it comes, on every stream variant of the helper; and every backend holding a helper
offers it (`HoldsHelper`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from test_mux import _TIMED, _VARIANTS, _PipeStream, _TimedPipeStream

from sandboxes._mux import Command, HoldsHelper, MuxClient, open_channel
from sandboxes._output import Stream
from sandboxes.docker import DockerSandbox
from sandboxes.kubernetes import KubernetesSandbox
from sandboxes.local import LocalSandbox
from sandboxes.ssh import SSHSandbox


@pytest.fixture(params=[*_VARIANTS, _TIMED])
def client(request: pytest.FixtureRequest) -> Iterator[MuxClient]:
    pipe = _TimedPipeStream() if request.param == _TIMED else _PipeStream(_VARIANTS[request.param])
    mux = MuxClient(pipe)
    yield mux
    mux.close()
    pipe.close()


class _Seen:
    """Output chunks as the reader hands them over, and a condition to wait on what came."""

    def __init__(self) -> None:
        self.chunks: list[tuple[bytes, str]] = []
        self._changed = threading.Condition()

    def __call__(self, chunk: bytes, stream: Stream = "stdout") -> None:
        with self._changed:
            self.chunks.append((chunk, stream))
            self._changed.notify_all()

    def text(self, stream: str = "stdout") -> bytes:
        return b"".join(chunk for chunk, name in self.chunks if name == stream)

    def wait_for(self, wanted: bytes, stream: str = "stdout") -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: wanted in self.text(stream), timeout=10), self.chunks


def test_stdin_goes_in_as_written_and_output_comes_back_as_it_arrives(client: MuxClient) -> None:
    seen = _Seen()
    channel = open_channel(client, Command("cat; echo done >&2", timeout=30, output_limit=1 << 16), on_output=seen)
    channel.write(b"first\n")
    seen.wait_for(b"first\n")  # answered before stdin ended: the channel is live both ways
    channel.write(b"second\n" + b"x" * 200_000 + b"\n")
    seen.wait_for(b"second\n")
    channel.close_stdin()
    answer = channel.wait(10)
    assert answer is not None
    assert answer.exit_code == 0
    assert seen.text() == b"first\nsecond\n" + b"x" * 200_000 + b"\n"
    assert seen.text("stderr") == b"done\n"
    assert channel.done


def test_a_kill_ends_the_channel_and_a_short_wait_answers_none(client: MuxClient) -> None:
    channel = open_channel(client, Command("sleep 60", timeout=120, output_limit=0))
    assert channel.wait(0.2) is None
    channel.kill()
    answer = channel.wait(10)
    assert answer is not None
    assert answer.exit_code not in (0, None)
    channel.kill()  # after its end: nothing


def test_the_helper_enforces_a_channels_own_timeout(client: MuxClient) -> None:
    answer = open_channel(client, Command("sleep 60", timeout=0.5, output_limit=0)).wait(15)
    assert answer is not None
    assert answer.error == "timeout"


def test_a_channel_is_awaited_on_an_event_loop(client: MuxClient) -> None:
    seen = _Seen()

    async def scenario() -> int | None:
        channel = open_channel(client, Command("read line; echo got $line", timeout=30, output_limit=0), on_output=seen)
        channel.write(b"hello\n")
        answer = await channel.wait_async()
        return answer.exit_code

    assert asyncio.run(scenario()) == 0
    assert seen.text() == b"got hello\n"


def test_commands_run_beside_an_open_channel(client: MuxClient) -> None:
    channel = open_channel(client, Command("cat", timeout=30, output_limit=0))
    answer = client.run(Command("echo beside", timeout=10, output_limit=1 << 10))
    assert answer.output == "beside\n"
    channel.close_stdin()
    assert channel.wait(10) is not None


def test_a_channels_stdin_is_written_as_it_goes_not_given_with_its_command(client: MuxClient) -> None:
    with pytest.raises(ValueError, match="written as it goes"):
        open_channel(client, Command("cat", timeout=30, output_limit=0, stdin=b"given"))
    assert client.run(Command("echo next", timeout=10, output_limit=100)).output == "next\n"  # nothing was sent


def test_every_backend_with_an_exec_helper_holds_one_driver() -> None:
    for backend in (LocalSandbox, DockerSandbox, KubernetesSandbox, SSHSandbox):
        assert issubclass(backend, HoldsHelper), backend
