"""The exec helper and its client over a local pipe: the real helper process, no container. The
stream and its frames: when a command may be resent, a broken or hostile stream, frames that
leave together, who reads. Also the pipe the other ``test_mux_*`` files run the helper over;
what a command does inside the helper is `test_mux_command`'s."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mux_faults import wrapped

from sandboxes import protocol as p
from sandboxes._mux import SERVER_SOURCE, Command, MuxBroken, MuxClient, TimedByteStream
from sandboxes._output import OutputHook

_VARIANTS = {
    "posix_spawn+subreaper": "",
    "popen": "import os\ndel os.posix_spawn  # as on Python < 3.8\n",
    "no-subreaper": "import sys\nsys.modules['ctypes'] = None  # no ctypes: no prctl, so every command is swept\n",
    "cold": "import os.path\nos.path.realpath = lambda path, _real=os.path.realpath: "
    "'/bin/bash' if path == '/bin/sh' else _real(path)  # no dash: no shell waits for a command\n",
}
"""Python code run before the helper's source: the helper as it runs where Python lacks what
its fast paths use."""


class _PipeStream:
    def __init__(self, prelude: str = "") -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", prelude + SERVER_SOURCE], stdin=subprocess.PIPE, stdout=subprocess.PIPE
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


class _TimedPipeStream(_PipeStream):
    """The same pipe as a `TimedByteStream`: a caller alone with its command reads its answer
    itself, and nobody reads while the client is idle (`MuxClient`'s docstring)."""

    def __init__(self, prelude: str = "") -> None:
        super().__init__(prelude)
        assert self.process.stdout is not None
        self._out = self.process.stdout.fileno()  # read raw: poll must see what is unread
        self._ready = select.poll()
        self._ready.register(self._out, select.POLLIN)

    def recv(self, size: int) -> bytes:
        return os.read(self._out, size)

    def recv_within(self, size: int, timeout: float | None) -> bytes | None:
        if timeout is not None and not self._ready.poll(timeout * 1000):
            return None
        return os.read(self._out, size)


_TIMED = "posix_spawn+subreaper, timed stream"


@pytest.fixture(params=[*_VARIANTS, _TIMED])
def stream(request: pytest.FixtureRequest) -> Iterator[_PipeStream]:
    pipe = _TimedPipeStream() if request.param == _TIMED else _PipeStream(_VARIANTS[request.param])
    yield pipe
    pipe.close()


def _run(client: MuxClient, command: str, on_output: OutputHook | None = None, **fields: object) -> p.ExecuteResponse:
    options: dict[str, object] = {"timeout": 10, "output_limit": 1 << 20}
    options.update(fields)
    return client.run(Command(command, **options), on_output)  # type: ignore[arg-type]


def _wait_for_file(path: Path, wait: float = 10.0) -> str:
    deadline = time.monotonic() + wait
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return path.read_text()


def test_an_unacknowledged_command_may_still_run_so_it_is_never_resent(stream: _PipeStream, tmp_path: Path) -> None:
    """A helper that stops answering (SIGSTOP) before acknowledging: the client gives up on the
    stream fast, and later commands fail fast too instead of hanging. But the request was
    written, and the helper, running again, reads it and runs the command: not acknowledged is
    not "not run", so the command is not resendable (sent to a fresh helper too, it would run
    twice)."""
    client = MuxClient(stream, ack_timeout=1.0)
    assert _run(client, "echo warm").output == "warm\n"
    ran = tmp_path / "ran"
    os.kill(stream.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(MuxBroken) as broken:
            _run(client, f"echo ran >> {ran}")
        assert broken.value.may_resend is False
        assert time.monotonic() - started < 5
        assert not client.alive
        with pytest.raises(MuxBroken) as after:
            _run(client, "echo after")
        assert after.value.may_resend is True  # known broken before anything was written
    finally:
        os.kill(stream.process.pid, signal.SIGCONT)
    assert _wait_for_file(ran) == "ran\n"


def test_a_command_whose_answer_was_lost_ran_and_is_never_resent(stream: _PipeStream, tmp_path: Path) -> None:
    faulty = wrapped(stream)
    client = MuxClient(faulty)
    assert _run(client, "echo warm").output == "warm\n"
    faulty.lose_answers()
    with pytest.raises(MuxBroken) as broken:
        _run(client, f"echo ran >> {tmp_path / 'ran'}")
    assert broken.value.may_resend is False
    assert (tmp_path / "ran").read_text() == "ran\n"


def test_a_request_not_written_whole_is_resendable_and_never_runs(stream: _PipeStream, tmp_path: Path) -> None:
    """The send of a request fails half way: the helper only acts on whole frames, and the
    client writes nothing more on that stream (whatever followed would complete the frame), so
    the command never runs here and may go to a fresh helper."""
    faulty = wrapped(stream)
    client = MuxClient(faulty)
    assert _run(client, "echo warm").output == "warm\n"
    faulty.fail_next_request()
    with pytest.raises(MuxBroken) as broken:
        _run(client, f"echo ran >> {tmp_path / 'ran'}", env={"TAG": "x"})
    assert broken.value.may_resend is True
    assert not client.alive
    with pytest.raises(MuxBroken) as after:
        _run(client, "echo after")
    assert after.value.may_resend is True
    assert client.kill_tagged("TAG", "x") == 0
    with pytest.raises(MuxBroken):
        client._send(b"K", 1)  # as a kill or stdin of a command on another thread would
    assert faulty.sends_after_failure == 0
    assert stream.process.stdin is not None
    stream.process.stdin.close()  # the helper holds half a request: its input ends there
    assert stream.process.wait(timeout=10) == 0
    assert not (tmp_path / "ran").exists()


def test_a_corrupt_frame_ends_the_stream_instead_of_hanging(stream: _PipeStream) -> None:
    client = MuxClient(stream)
    stream.send(b"\x7f" + b"\x00" * 8)  # an unknown frame kind (no kind is a control byte): the helper must hang up
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


def _gone(pid: int, *, zombie_ok: bool, wait: float = 10.0) -> bool:
    """Whether ``pid`` ends within ``wait`` seconds (reaped; or a zombie, when that is enough)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):  # reaped before the open, or between it and the read
            return True
        if zombie_ok and state == "Z":
            return True
        time.sleep(0.02)
    return False


def _idle(stream: _PipeStream, client: MuxClient, wait: float = 10.0) -> None:
    """Until the helper waits in its loop (``epoll_wait``) with the shell it starts after an
    answer (`_spawn.Spares`) started. A child between its clone and its exec holds a copy of
    every fd of the helper, the stream's end included: a helper killed then is seen dead only
    once that child has exec'd, so a request may be written first (and the helper was not
    idle). Not the probe's shell, which the helper waits on in ``poll``, then spawns another."""
    if not client.info.get("warm"):
        return
    deadline = time.monotonic() + wait
    pid = stream.process.pid
    while True:
        with contextlib.suppress(FileNotFoundError):
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            waiting = Path(f"/proc/{pid}/wchan").read_text() == "do_epoll_wait"
            if waiting and children and all(_cmdline(int(child)) == b"/bin/sh\0-s\0" for child in children):
                return
        assert time.monotonic() < deadline, "the helper never came to wait with its shell started"
        time.sleep(0.01)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def test_hello_says_how_commands_are_spawned(stream: _PipeStream, request: pytest.FixtureRequest) -> None:
    """Proves the variants exercise the fallbacks they are named after."""
    info = MuxClient(stream).info
    variant = request.node.callspec.params["stream"]
    assert isinstance(stream, TimedByteStream) is (variant == _TIMED)
    assert info["spawn"] == ("popen" if variant == "popen" else "posix_spawn")
    assert info["warm"] is (variant != "cold")  # (the machine's /bin/sh is dash: test_mux_spawn checks)
    small_limit = info["pids_limit"] is not None and info["pids_limit"] <= 4096  # no subreaper there, by design
    assert info["subreaper"] is (variant != "no-subreaper" and not small_limit)


def _exchange(stream: _PipeStream, kind: bytes, ident: int, payload: bytes) -> tuple[bytes, dict[str, object] | str]:
    """One raw frame to the helper and its answer (X as JSON, E or H as text; an acknowledgement
    before it is skipped), without `MuxClient`, whose own checks would stop a frame the helper
    must refuse by itself."""
    stream.send(struct.pack(">cII", kind, ident, len(payload)) + payload)
    received = b""
    while True:
        while len(received) < 9 or len(received) < 9 + struct.unpack(">cII", received[:9])[2]:
            chunk = stream.recv(65536)
            assert chunk, "the helper closed its stream"
            received += chunk
        answer, answered, length = struct.unpack(">cII", received[:9])
        body, received = received[9 : 9 + length], received[9 + length :]
        if answer != b"A":
            break
    assert answered == ident
    return answer, (json.loads(body) if answer == b"X" else body.decode())


# ---------------------------------------------------------------------------- a hostile stream

_UNPRIVILEGED = ["setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups", "/usr/bin/python3"]
"""How the helper runs in a sandbox: not root (as root, with CAP_SYS_PTRACE, nothing stops a
command reaching into any process). When the tests run as root, the helper is started as uid
1000 through setpriv, with the system's python3 (the tests' own may sit in root's home)."""

_REACH_INTO = r"""
import ctypes, json, os, struct, sys
helper = int(sys.argv[1])
forged = struct.pack(">cII", b"O", 1, (4 << 30) - 1) + b"\0" * (1 << 20)  # 'here come 4 GiB'
outcomes = {}
def attempt(name, action):
    try:
        action()
        outcomes[name] = "ok"
    except OSError as exc:
        outcomes[name] = os.strerror(exc.errno)
def write_fd():
    with open("/proc/%d/fd/1" % helper, "wb", buffering=0) as fh:
        for _ in range(8):
            fh.write(forged)
def open_mem():
    os.close(os.open("/proc/%d/mem" % helper, os.O_RDWR))
def getfd():
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(helper)
    try:
        if libc.syscall(438, pidfd, 1, 0) < 0:  # pidfd_getfd(pidfd, 1, 0)
            raise OSError(ctypes.get_errno(), "pidfd_getfd")
    finally:
        os.close(pidfd)
attempt("fd", write_fd)
attempt("mem", open_mem)
attempt("pidfd_getfd", getfd)
print(json.dumps(outcomes))
"""


def _unprivileged_stream(prelude: str = "") -> _PipeStream:
    stream = _PipeStream.__new__(_PipeStream)
    argv = _UNPRIVILEGED if os.getuid() == 0 else [sys.executable]
    stream.process = subprocess.Popen(
        [*argv, "-c", prelude + SERVER_SOURCE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd="/tmp"
    )
    if os.getuid() == 0:  # as runc does for a `docker exec`: the helper's stdio belongs to its user
        for pipe in (stream.process.stdin, stream.process.stdout):
            assert pipe is not None
            os.fchown(pipe.fileno(), 1000, 1000)
    return stream


@pytest.mark.parametrize("variant", ["posix_spawn+subreaper", "no-subreaper"])
def test_a_command_cannot_write_into_the_helpers_stream(variant: str) -> None:
    """A command opens the helper's stdout (or its memory, or takes the fd with pidfd_getfd) to
    forge a frame announcing 4 GiB. The helper makes itself undumpable, so all three are refused
    and it keeps serving; where it cannot (no ctypes), the client drops the forged stream at the
    header instead of buffering it."""
    stream = _unprivileged_stream(_VARIANTS[variant])
    try:
        client = MuxClient(stream)
        helper = client.info["pid"]
        script = "python3 -c " + shlex.quote(_REACH_INTO) + f" {helper}"
        if client.info["undumpable"]:
            result = _run(client, script)
            assert result.exit_code == 0, result
            outcomes = json.loads(result.output)
            assert len(outcomes) == 3, outcomes
            assert "ok" not in outcomes.values(), outcomes
            assert _run(client, "echo alive").output == "alive\n"
        else:
            assert variant == "no-subreaper"  # no ctypes: no prctl either
            started = time.monotonic()
            with pytest.raises(MuxBroken, match="corrupt"):
                _run(client, script)
            assert time.monotonic() - started < 10
    finally:
        stream.close()


def test_what_answers_instead_of_a_helper_is_quoted_in_the_error() -> None:
    """A runtime that cannot start the helper (no python3 in the image) answers on the helper's
    stream in words: the error quotes them, bounded and escaped, instead of a frame's garbage."""
    words = 'OCI runtime exec failed: exec: "python3": executable file not found in $PATH\r\n' * 20
    stream = _PipeStream.__new__(_PipeStream)
    stream.process = subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.stdout.write({words!r})"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        with pytest.raises(MuxBroken) as raised:
            MuxClient(stream, hello_timeout=10)
        message = str(raised.value)
        assert 'not an exec helper; it said b\'OCI runtime exec failed: exec: "python3"' in message, message
        assert "\\r\\n" in message  # escaped,
        assert "\r" not in message  # not raw
        assert len(message) < 500
    finally:
        stream.close()


_HOSTILE_HELPER = r"""
import json, os, struct, sys
os.read(0, 9)  # the client's ping
hello = json.dumps({"pid": os.getpid()}).encode()
os.write(1, struct.pack(">cII", b"H", 0, len(hello)) + hello)
os.read(0, 9)  # the header of the client's first command: answer it with a forged frame
written = 0
try:
    os.write(1, struct.pack(">cII", b"O", 1, (4 << 30) - 1))
    chunk = b"\0" * 65536
    while written < 256 << 20:
        written += os.write(1, chunk)
except OSError:
    pass
with open(sys.argv[1], "w") as fh:
    fh.write(str(written))
"""


class _ClosingStream(_PipeStream):
    """Closing it closes the pipes (a socket's close), without killing the process behind."""

    def close(self) -> None:
        for pipe in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                assert pipe is not None
                pipe.close()


def test_a_frame_announcing_gigabytes_drops_the_stream_unbuffered(tmp_path: Path) -> None:
    """Whatever reaches the client's stream (a helper that lost the race to become undumpable, a
    compromised one), a header announcing 4 GiB ends the stream at once: the client stops
    reading, so the sender is cut off long before it could fill the client's memory."""
    report = tmp_path / "written"
    stream = _ClosingStream.__new__(_ClosingStream)
    stream.process = subprocess.Popen(
        [sys.executable, "-c", _HOSTILE_HELPER, str(report)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        client = MuxClient(stream, ack_timeout=30)
        started = time.monotonic()
        with pytest.raises(MuxBroken, match="corrupt"):
            _run(client, "true", timeout=0)
        assert time.monotonic() - started < 10, "the client kept reading a 4 GiB frame"
        assert not client.alive
        assert stream.process.wait(timeout=10) == 0
        assert int(report.read_text()) < 8 << 20  # cut off: the client closed its end
    finally:
        stream.close()
        stream.process.kill()
        stream.process.wait()


_LOG_WRITES = """
import os
_real_write = os.write
def _logged_write(fd, data, _log=open({log!r}, "a")):
    written = _real_write(fd, data)
    if fd == 1:
        _log.write(bytes(data[:written]).hex() + "\\n")
        _log.flush()
    return written
os.write = _logged_write
"""
"""Run before the helper: every write it makes to the client, one hex line each."""


def _frames_by_write(log: Path) -> list[list[tuple[bytes, int]]]:
    """(kind, command id) of every frame, grouped by the helper's write that carried it."""
    writes = []
    for line in log.read_text().split():
        data, frames, offset = bytes.fromhex(line), [], 0
        while offset < len(data):
            kind, ident, length = struct.unpack_from(">cII", data, offset)
            frames.append((kind, ident))
            offset += 9 + length
        writes.append(frames)
    return writes


def test_a_short_commands_acknowledgement_output_and_exit_leave_in_one_write(tmp_path: Path) -> None:
    """One write is one SSH packet (one docker frame) and one wake-up of the client's reader
    instead of three (benchmarks/bench_ssh.py measures the gain). The acknowledgement waits for
    the exit at most `HOLD` (5 ms), which a loaded machine may exceed once: one run in ten is
    asked for (before, never: each frame had a write of its own)."""
    log = tmp_path / "writes"
    stream = _PipeStream(_LOG_WRITES.format(log=str(log)))
    try:
        client = MuxClient(stream)
        for i in range(10):
            assert _run(client, f"echo {i}").output == f"{i}\n"
        assert stream.process.stdin is not None
        stream.process.stdin.close()  # its input ended, it exits: every write it made is logged by then
        assert stream.process.wait(timeout=30) == 0
    finally:
        stream.close()
    writes = _frames_by_write(log)
    sent = [frame for frames in writes for frame in frames]
    assert sent == [(b"H", 0)] + [(kind, i) for i in range(1, 11) for kind in (b"A", b"O", b"X")]  # order kept
    assert any(frames == [(b"A", i), (b"O", i), (b"X", i)] for i in range(1, 11) for frames in writes), writes


def test_a_silent_command_is_acknowledged_while_it_runs(stream: _PipeStream) -> None:
    """The acknowledgement waits for the command's first output or exit only `HOLD` seconds, not
    until the command ends: a long silent command is still acknowledged at once."""
    client = MuxClient(stream)
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(_run, client, "sleep 3")
        deadline = time.monotonic() + 2
        while not any(item.accepted_at for item in list(client._pending.values())):
            assert time.monotonic() < deadline, "a running command was not acknowledged within 2 s"
            time.sleep(0.01)
        assert not running.done()
        assert running.result().exit_code == 0


def test_a_helper_that_died_while_idle_is_found_before_the_next_request(stream: _PipeStream) -> None:
    """Nobody reads an idle timed stream: the next caller must still find the helper dead before
    it writes, so that its command may go to a fresh helper (it cannot have run)."""
    client = MuxClient(stream)
    assert _run(client, "echo warm").output == "warm\n"
    _idle(stream, client)
    stream.process.kill()
    stream.process.wait()
    with pytest.raises(MuxBroken) as broken:
        _run(client, "echo after")
    assert broken.value.may_resend is True
    assert not client.alive


def test_over_a_timed_stream_a_caller_alone_reads_its_own_answer() -> None:
    """Sequential commands are read by their callers (no thread hand-off); commands from many
    threads at once are all answered, whoever reads; then a lone caller reads again."""
    stream = _TimedPipeStream()
    readers: list[str] = []
    recv_within = stream.recv_within

    def recorded(size: int, timeout: float | None) -> bytes | None:
        readers.append(threading.current_thread().name)
        return recv_within(size, timeout)

    stream.recv_within = recorded  # type: ignore[method-assign]
    try:
        client = MuxClient(stream)
        for index in range(5):
            readers.clear()
            assert _run(client, f"echo {index}").output == f"{index}\n"
            assert readers
            assert set(readers) == {threading.current_thread().name}
        with ThreadPoolExecutor(8) as pool:
            outputs = list(pool.map(lambda i: _run(client, f"sleep 0.0{i % 3}; echo {i}").output, range(40)))
        assert outputs == [f"{i}\n" for i in range(40)]
        deadline = time.monotonic() + 5
        while True:  # the reader thread hands reading back once nothing waits
            readers.clear()
            assert _run(client, "echo alone").output == "alone\n"
            if set(readers) == {threading.current_thread().name}:
                break
            assert time.monotonic() < deadline, f"read by {set(readers)} after the burst"
    finally:
        stream.close()


@pytest.mark.parametrize("timed", [False, True], ids=["reader thread", "caller reads"])
def test_a_native_write_that_fails_midway_is_answered_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timed: bool
) -> None:
    """A write that fails on the way (here at the file-size limit: EFBIG after 1 MiB) is answered
    at the failure, and the client sends no more of it, whether the reader thread or the caller
    itself reads the answer; nothing is left behind and the helper serves on. Before, all the
    bytes went first (a 6 GiB upload into a full disk sent all 6 GiB)."""
    prelude = "import resource\nresource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))\n"
    pipe = _TimedPipeStream(prelude) if timed else _PipeStream(prelude)
    sent = [0]
    send = pipe.send

    def counting(data: bytes) -> None:
        sent[0] += len(data)
        send(data)

    monkeypatch.setattr(pipe, "send", counting)
    try:
        client = MuxClient(pipe)
        size = 64 << 20
        op = ["write", str(tmp_path / "big"), str(size), "0123456789abcdef"]
        answer = client.run_native(op, b"x" * size, timeout=60, output_limit=1 << 20)
        assert answer is not None
        assert answer.exit_code == 12, answer  # refused: the script's code for a write that failed
        assert sent[0] < 16 << 20, f"{sent[0]} of {size} bytes sent"
        assert list(tmp_path.iterdir()) == []
        assert _run(client, "echo alive").output == "alive\n"
    finally:
        pipe.close()
