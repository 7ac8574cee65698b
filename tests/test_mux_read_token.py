"""Who reads a timed stream (`sandboxes._mux._reader`): never nobody while a command waits.

The helper writes its frames blocking, so it takes no more input while the client leaves its
output unread; a caller that holds the read token and blocks in a send (a command's stdin)
while holding it would then wait for the helper, the helper for a reader, and the reader for
the token. Reproduced deterministically with the smallest pipes Linux allows, where the helper
blocks on its first output the client does not read."""

from __future__ import annotations

import array
import fcntl
import termios
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_mux import _run, _TimedPipeStream

from sandboxes._helper.frames import STDIN
from sandboxes._mux import MuxClient, _stall

_PAGE = 4096


class _OutputFirst(_TimedPipeStream):
    """Holds the first stdin frame until the helper's output fills the pipe to the client, so
    that the helper is blocked writing when the stdin goes (unless someone reads: then it goes
    once a bounded wait is over)."""

    def __init__(self) -> None:
        super().__init__()
        self.filled = False
        self._held = False

    def send(self, data: bytes) -> None:
        if data[:1] == STDIN and not self._held:
            self._held = True
            deadline = time.monotonic() + 2.0
            while not self.filled and time.monotonic() < deadline:
                self.filled = _unread(self._out) >= _PAGE
                time.sleep(0.001)
        super().send(data)


def _unread(fd: int) -> int:
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count)
    return count[0]


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> Iterator[_OutputFirst]:
    """A timed stream to a helper over one-page pipes; a send that stalls gives up in seconds."""
    monkeypatch.setattr(_stall, "STALL", 5.0)
    stream = _OutputFirst()
    assert stream.process.stdin is not None
    assert stream.process.stdout is not None
    for fd in (stream.process.stdin.fileno(), stream.process.stdout.fileno()):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PAGE)
    yield stream
    stream.close()


def _idle(client: MuxClient) -> MuxClient:
    """Once the reader thread has let go of the read token after the hello: the next caller
    takes it."""
    assert client._reading.acquire(timeout=10)
    client._reading.release()
    return client


def test_a_caller_sending_stdin_is_read_for_meanwhile(narrow: _OutputFirst) -> None:
    """The command prints a lot before it reads its stdin: the helper blocks writing it at once."""
    client = _idle(MuxClient(narrow))
    size = 1 << 20
    result = _run(client, f"head -c {size} /dev/zero | tr '\\0' o; wc -c", stdin=b"i" * size, output_limit=4 * size)
    assert (result.error, result.exit_code) == (None, 0), result.message
    assert result.output == "o" * size + f"{size}\n"


def test_concurrent_commands_with_stdin_over_narrow_pipes(narrow: _OutputFirst) -> None:
    client = _idle(MuxClient(narrow))

    def one(i: int) -> str:
        if i % 2:
            return _run(client, f"echo {i}").output
        return _run(client, "cat", stdin=f"{i}\n".encode() * 20_000).output

    with ThreadPoolExecutor(max_workers=6) as pool:
        outputs = list(pool.map(one, range(12)))
    assert outputs == [f"{i}\n" * (1 if i % 2 else 20_000) for i in range(12)]
