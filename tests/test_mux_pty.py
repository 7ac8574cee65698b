"""A command on a pseudo-terminal through the exec helper (an R spec with ``pty``, Z to resize:
`sandboxes._helper._pty`), on every stream variant of the helper."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator

import pytest
from test_mux import _TIMED, _VARIANTS, _PipeStream, _TimedPipeStream
from test_mux_channel import _Seen as _Chunks

from sandboxes._helper.frames import RESIZE
from sandboxes._mux import Channel, Command, MuxClient, open_channel
from sandboxes._mux._frames import wire_spec
from sandboxes.terminal import pty_spec


class _Seen(_Chunks):
    def wait_until(self, condition: Callable[[bytes], bool]) -> None:
        """Until ``condition`` holds of the output so far (10 s at most)."""
        with self._changed:
            assert self._changed.wait_for(lambda: condition(self.text()), timeout=10), self.chunks


@pytest.fixture(params=[*_VARIANTS, _TIMED])
def client(request: pytest.FixtureRequest) -> Iterator[MuxClient]:
    pipe = _TimedPipeStream() if request.param == _TIMED else _PipeStream(_VARIANTS[request.param])
    mux = MuxClient(pipe)
    yield mux
    mux.close()
    pipe.close()


def _terminal(
    client: MuxClient, command: str, seen: _Seen, cols: int = 80, rows: int = 24, **options: object
) -> Channel:
    options = {"timeout": 30, "output_limit": 1 << 16, **options}
    return open_channel(client, Command(command, **options), on_output=seen, spec=pty_spec(cols, rows))  # type: ignore[arg-type]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it only waits to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return False
    return data[data.rindex(b")") + 2 :].split()[0] not in (b"Z", b"X")


def _wait_for_program(pid: int, program: bytes) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if fh.read().split(b"\0")[0].endswith(program):
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{pid} never ran {program!r}"
        time.sleep(0.01)


def test_the_command_runs_on_a_terminal_with_xterm_and_its_own_exit_code(client: MuxClient) -> None:
    seen = _Seen()
    answer = _terminal(client, 'tty; echo "term=$TERM"; [ -t 0 ] && [ -t 2 ] && echo all-tty; exit 3', seen).wait(10)
    assert answer is not None
    assert answer.exit_code == 3
    text = seen.text()
    assert re.search(rb"^/dev/pts/\d+\r\n", text), text
    assert b"term=xterm-256color\r\n" in text
    assert b"all-tty\r\n" in text
    assert seen.text("stderr") == b""  # one output: the terminal's


def test_the_requests_term_wins(client: MuxClient) -> None:
    seen = _Seen()
    answer = _terminal(client, 'echo "term=$TERM"', seen, env={"TERM": "vt100"}).wait(10)
    assert answer is not None
    assert b"term=vt100\r\n" in seen.text()


def test_stty_answers_the_specs_size_then_the_resized_one(client: MuxClient) -> None:
    seen = _Seen()
    channel = _terminal(client, "trap 'echo winch' WINCH; stty size; read x; stty size", seen, cols=91, rows=27)
    seen.wait_for(b"27 91\r\n")
    channel.send(RESIZE, wire_spec({"cols": 120, "rows": 40}))
    seen.wait_for(b"winch\r\n")  # the foreground group got SIGWINCH
    channel.write(b"\n")
    answer = channel.wait(10)
    assert answer is not None
    assert answer.exit_code == 0
    # The echo of the typed newline may come before or after stty's line: the size is what counts.
    assert b"40 120\r\n" in seen.text().split(b"winch\r\n", 1)[1], seen.text()


def test_a_bad_resize_changes_nothing_and_a_bad_size_is_refused(client: MuxClient) -> None:
    seen = _Seen()
    channel = _terminal(client, "read x; stty size", seen, cols=50, rows=10)
    channel.send(RESIZE, wire_spec({"cols": 0, "rows": 10}))
    channel.send(RESIZE, b"not marshal")
    channel.write(b"\n")
    answer = channel.wait(10)
    assert answer is not None
    assert seen.text().endswith(b"10 50\r\n"), seen.text()
    refused = _terminal(client, "echo never", seen, cols=-1).wait(10)
    assert refused is not None
    assert refused.error is not None
    assert "cols and rows" in (refused.message or "")


def test_input_is_echoed_and_ctrl_d_ends_a_reader(client: MuxClient) -> None:
    seen = _Seen()
    channel = _terminal(client, "cat; echo cat-ended", seen)
    channel.write(b"hello\n")
    seen.wait_for(b"hello\r\nhello\r\n")  # the terminal's echo, then cat's
    channel.write(b"\x04")
    answer = channel.wait(10)
    assert answer is not None
    assert answer.exit_code == 0
    assert seen.text().endswith(b"cat-ended\r\n")


def test_ctrl_c_interrupts_a_sleep(client: MuxClient) -> None:
    seen = _Seen()
    channel = _terminal(client, "echo pid=$$; exec sleep 60", seen, timeout=120)
    seen.wait_until(lambda text: re.search(rb"pid=(\d+)\r\n", text) is not None)
    match = re.search(rb"pid=(\d+)\r\n", seen.text())
    assert match is not None
    _wait_for_program(int(match[1]), b"sleep")  # the shell, until then, would take the SIGINT
    channel.write(b"\x03")
    answer = channel.wait(10)
    assert answer is not None, seen.chunks
    assert answer.exit_code == 130  # SIGINT


def test_a_kill_ends_the_whole_tree_jobs_in_groups_of_their_own_included(client: MuxClient) -> None:
    seen = _Seen()
    job = "sh -c 'echo pid=$$; exec sleep 300' &"
    script = f"set -m; env -u SANDBOXES_EXEC_ID {job} {job} setsid {job} wait"
    channel = _terminal(client, script, seen, timeout=120)
    seen.wait_until(lambda text: len(re.findall(rb"pid=(\d+)\r\n", text)) == 3)
    pids = [int(pid) for pid in re.findall(rb"pid=(\d+)\r\n", seen.text())]
    assert all(_alive(pid) for pid in pids)
    channel.kill()
    answer = channel.wait(10)
    assert answer is not None
    assert answer.exit_code not in (0, None)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, [pid for pid in pids if _alive(pid)]
        time.sleep(0.02)


def test_the_timeout_ends_a_terminal(client: MuxClient) -> None:
    seen = _Seen()
    answer = _terminal(client, "sleep 60", seen, timeout=0.5).wait(15)
    assert answer is not None
    assert answer.error == "timeout"


def test_bounds_hold_output_in_bounded_chunks_and_input_past_the_terminals_buffer(client: MuxClient) -> None:
    seen = _Seen()
    answer = _terminal(client, "head -c 300000 /dev/zero | tr '\\0' x", seen).wait(20)
    assert answer is not None
    assert answer.exit_code == 0
    assert max(len(chunk) for chunk, _ in seen.chunks) <= 65536
    assert seen.text() == b"x" * 300000
    assert len(answer.output) < (1 << 16) + 200  # the answer keeps output_limit's head and tail
    fed = _Seen()
    channel = _terminal(client, "stty -echo; echo ready; head -c 100000 | wc -c", fed)
    fed.wait_for(b"ready\r\n")
    channel.write((b"y" * 99 + b"\n") * 1000)  # far past the terminal's input buffer (4 KiB)
    finished = channel.wait(20)
    assert finished is not None
    assert finished.exit_code == 0
    assert fed.text().split() == [b"ready", b"100000"]


def test_a_command_without_a_terminal_ignores_a_resize(client: MuxClient) -> None:
    seen = _Seen()
    channel = open_channel(client, Command("read x; echo plain", timeout=30, output_limit=0), on_output=seen)
    channel.send(RESIZE, wire_spec({"cols": 10, "rows": 10}))
    channel.write(b"\n")
    answer = channel.wait(10)
    assert answer is not None
    assert seen.text() == b"plain\n"
