"""A command's life in the exec helper (`sandboxes._helper._command`), over a local pipe to the real
helper process (no container): its exit code, output and stdin, its timeout, and the end of
every process it started, escaped or orphaned, with it or by its marker."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import struct
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_mux import _TIMED, _VARIANTS, _exchange, _gone, _PipeStream, _run, _TimedPipeStream

from sandboxes import protocol as p
from sandboxes._mux import MuxClient
from sandboxes._mux.client import wire_spec


@pytest.fixture(params=[*_VARIANTS, _TIMED])
def stream(request: pytest.FixtureRequest) -> Iterator[_PipeStream]:
    pipe = _TimedPipeStream() if request.param == _TIMED else _PipeStream(_VARIANTS[request.param])
    yield pipe
    pipe.close()


def test_commands_run_concurrently_with_stdin_and_exit_codes(stream: _PipeStream) -> None:
    client = MuxClient(stream)
    mixed = _run(client, "echo out; echo err >&2; exit 3")
    assert (mixed.output, mixed.exit_code, mixed.error) == ("out\nerr\n", 3, None)
    result = _run(client, "wc -c", stdin=b"\x00" * 3_000_000)
    assert result.output.strip() == "3000000"
    assert _run(client, "kill -9 $$").exit_code == 137


_ESCAPES = (
    "sleep 300 & echo $!; setsid sleep 300 & echo $!; sh -c 'setsid sleep 300 & echo $!'; sh -c 'sleep 300 & echo $!'"
)
"""A background job, one in its own session, and two orphans (one also in its own session):
each prints its pid."""


def test_everything_a_command_started_ends_with_it(stream: _PipeStream) -> None:
    """Escaped or orphaned, every process a command started is killed once it ends, and the helper
    (a subreaper, when it can be) reaps the orphans it adopted: no zombie is left behind."""
    client = MuxClient(stream)
    for _ in range(3):  # again and again: the check that skips the /proc sweep must not go stale
        result = _run(client, _ESCAPES)
        assert result.exit_code == 0, result
        pids = [int(pid) for pid in result.output.split()]
        assert len(pids) == 4
        assert all(_gone(pid, zombie_ok=not client.info["subreaper"]) for pid in pids), pids


_UNMARKED = "env -u SANDBOXES_EXEC_ID setsid sh -c 'sleep 301 & echo $!'"
"""A process that dropped the marker AND left the group, orphaned at once: found by neither."""


def test_a_process_that_dropped_the_marker_and_left_the_group_ends_with_its_command(stream: _PipeStream) -> None:
    """The helper, a subreaper, adopts the orphan and kills it when the command ends; later
    commands' leftovers are still found. On a host without a subreaper (no ctypes) the orphan
    goes to the host's init, where the helper must not touch anything: it survives there."""
    client = MuxClient(stream)
    escaped = _run(client, _UNMARKED)
    stray = int(escaped.output)
    try:
        if client.info["subreaper"]:
            assert _gone(stray, zombie_ok=True), stray
        else:
            assert not _gone(stray, zombie_ok=True, wait=0.5)
        result = _run(client, _ESCAPES)
        pids = [int(pid) for pid in result.output.split()]
        assert all(_gone(pid, zombie_ok=not client.info["subreaper"]) for pid in pids), pids
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stray, signal.SIGKILL)


def test_a_timeout_kills_what_dropped_the_marker(stream: _PipeStream) -> None:
    """Timed out while an unmarked, escaped loop holds the output open: the command is answered
    promptly and the loop is dead (where the helper is a subreaper)."""
    client = MuxClient(stream)
    started = time.monotonic()
    result = _run(client, _UNMARKED + "; echo waiting; sleep 300", timeout=1)
    assert result.error == p.TIMEOUT, result
    assert time.monotonic() - started < 5
    stray = int(result.output.split()[0])
    try:
        assert _gone(stray, zombie_ok=True, wait=10 if client.info["subreaper"] else 0.5) is client.info["subreaper"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stray, signal.SIGKILL)


def test_a_timeout_kills_the_whole_tree_and_keeps_the_output(stream: _PipeStream) -> None:
    client = MuxClient(stream)
    started = time.monotonic()
    result = _run(client, _ESCAPES + "; echo waiting; sleep 300", timeout=1)
    assert result.error == p.TIMEOUT, result
    assert time.monotonic() - started < 8
    assert result.output.splitlines()[-1] == "waiting"
    pids = [int(pid) for pid in result.output.split()[:4]]
    assert all(_gone(pid, zombie_ok=not client.info["subreaper"]) for pid in pids), pids
    assert _run(client, "echo alive").output == "alive\n"


def test_concurrent_commands_with_output_stdin_and_a_kill(stream: _PipeStream) -> None:
    client = MuxClient(stream)

    def one(i: int) -> p.ExecuteResponse:
        if i % 3 == 0:
            return _run(client, "cat; echo end", stdin=f"in{i}\n".encode() * 20_000)
        return _run(client, f"echo start{i}; sleep 0.3; echo end{i}; exit {i % 5}")

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, range(16)))
    for i, result in enumerate(results):
        if i % 3 == 0:
            assert result.output == f"in{i}\n" * 20_000 + "end\n"
        else:
            assert (result.output, result.exit_code) == (f"start{i}\nend{i}\n", i % 5)


def test_a_command_that_cannot_start_is_reported_and_the_helper_keeps_serving(stream: _PipeStream) -> None:
    client = MuxClient(stream)
    missing = _run(client, "true", cwd="/no/such/directory")
    assert missing.error == p.FILE_NOT_FOUND, missing
    bad_env = _run(client, "true", env={"A=B": "x"})
    assert bad_env.error == p.BACKEND_ERROR, bad_env
    assert _run(client, "pwd", cwd="/tmp").output == "/tmp\n"
    here = os.getcwd()  # where the helper started: commands without a cwd run there, even after others
    assert _run(client, "pwd").output == f"{here}\n"
    assert _run(client, "pwd", cwd="/").output == "/\n"
    assert _run(client, "pwd", cwd=".").output == f"{here}\n"
    assert _run(client, "echo $X", env={"X": "y"}).output == "y\n"


def test_the_helper_kills_by_marker_what_outlived_its_command(stream: _PipeStream, tmp_path: Path) -> None:
    """Frame M: the helper itself kills every process carrying a marker (here a background job's,
    which the sweep of orphans spares), after the command that made them has ended; nothing is
    started for it (`sandboxes.base.KillsTagged`: so it works where no process can start)."""
    client = MuxClient(stream)
    marker = f"sandboxes-job-{os.getpid()}x{time.monotonic_ns()}"
    written = tmp_path / "pids"
    inner = f"sleep 302 & echo $! $$ > {written}.new && mv {written}.new {written}; exec sleep 302"
    detach = (
        f"SANDBOXES_EXEC_ID={marker} setsid sh -c {shlex.quote(inner)} < /dev/null > /dev/null 2>&1 &"
        f" while [ ! -e {written} ]; do sleep 0.01; done"  # out of the command's group before it ends
    )
    assert _run(client, detach).exit_code == 0
    pids = [int(pid) for pid in written.read_text().split()]
    assert len(pids) == 2
    assert all(os.path.exists(f"/proc/{pid}") for pid in pids)
    assert client.kill_marked("SANDBOXES_EXEC_ID", marker) is True
    assert all(_gone(pid, zombie_ok=True) for pid in pids), pids
    assert client.kill_marked("SANDBOXES_EXEC_ID", marker) is True  # none left: nothing to do
    with pytest.raises(ValueError, match="empty marker"):
        client.kill_marked("SANDBOXES_EXEC_ID", "")
    assert _run(client, "echo still serving").output == "still serving\n"


def test_the_helper_kills_by_the_exact_marker_only(stream: _PipeStream) -> None:
    """Frame M matches a whole ``name=value`` entry: an empty value or name is refused by the
    helper itself (not only by its client), and a value that is a prefix of a process's marker
    (here the job's, whose roles add ``-s``) kills nothing; the exact value kills it."""
    marker = f"sandboxes-job-{os.getpid()}x{time.monotonic_ns()}"
    process = subprocess.Popen(
        ["sleep", "303"], env={**os.environ, "SANDBOXES_EXEC_ID": f"{marker}-s"}, start_new_session=True
    )
    try:
        for number, spec in enumerate(({"name": "SANDBOXES_EXEC_ID", "value": ""}, {"name": "", "value": marker}), 1):
            answer, detail = _exchange(stream, b"M", number, wire_spec(spec))
            assert answer == b"E", detail
        answer, detail = _exchange(stream, b"M", 3, wire_spec({"name": "SANDBOXES_EXEC_ID", "value": marker}))
        assert (answer, detail) == (b"X", {"code": 0, "timed_out": False})
        assert process.poll() is None, "a prefix of its marker killed it"
        spec = {"name": "SANDBOXES_EXEC_ID", "value": f"{marker}-s"}
        assert _exchange(stream, b"M", 4, wire_spec(spec))[0] == b"X"
        assert process.wait(timeout=10) == -signal.SIGKILL
    finally:
        process.kill()
        process.wait()


def _frames(stream: _PipeStream, ident: int, spec: dict[str, object]) -> list[tuple[bytes, bytes]]:
    """The raw frames (kind, payload) the helper sends for one R frame, up to its X."""
    payload = wire_spec(spec)
    stream.send(struct.pack(">cII", b"R", ident, len(payload)) + payload)
    received, frames = b"", []
    while not frames or frames[-1][0] != b"X":
        while len(received) < 9 or len(received) < 9 + struct.unpack(">cII", received[:9])[2]:
            chunk = stream.recv(65536)
            assert chunk, "the helper closed its stream"
            received += chunk
        kind, answered, length = struct.unpack(">cII", received[:9])
        assert answered == ident
        frames.append((kind, received[9 : 9 + length]))
        received = received[9 + length :]
    return frames


def test_stdout_and_stderr_leave_the_helper_in_frames_of_their_own(stream: _PipeStream) -> None:
    """Stdout in O frames, stderr in S frames (`frames.STDERR`): never one pipe for both."""
    stream.send(struct.pack(">cII", b"P", 0, 0))
    assert stream.recv(65536)[:1] == b"H"
    frames = _frames(stream, 1, {"command": "echo out; echo err >&2; echo more", "env": {}, "cwd": None})
    kinds = {kind for kind, _ in frames}
    assert kinds <= {b"A", b"O", b"S", b"X"}, frames
    assert b"".join(body for kind, body in frames if kind == b"O") == b"out\nmore\n"
    assert b"".join(body for kind, body in frames if kind == b"S") == b"err\n"


def test_the_client_hands_each_chunk_over_with_its_stream(stream: _PipeStream) -> None:
    """The hook sees each stream's bytes apart; the answer merges them, bounded together by the
    output limit (head and tail), in the order they arrived."""
    client = MuxClient(stream)
    command = "echo out; echo err >&2; sleep 0.2; echo late >&2; echo done"
    for _ in range(2):  # cold, then in a shell started ahead of it
        seen: list[tuple[bytes, str]] = []
        result = _run(client, command, on_output=lambda chunk, name, seen=seen: seen.append((chunk, name)))
        assert b"".join(chunk for chunk, name in seen if name == "stdout") == b"out\ndone\n"
        assert b"".join(chunk for chunk, name in seen if name == "stderr") == b"err\nlate\n"
        assert result.output.index("late\n") > max(result.output.index("out\n"), result.output.index("err\n"))
        assert sorted(result.output.splitlines()) == ["done", "err", "late", "out"]
    capped = _run(
        client, "head -c 3000 /dev/zero | tr '\\0' o; head -c 3000 /dev/zero | tr '\\0' e >&2", output_limit=100
    )
    assert capped.truncated
    assert capped.output.startswith("o" * 50)
    assert capped.output.endswith("e" * 50)
