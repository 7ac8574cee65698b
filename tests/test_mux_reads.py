"""The exec helper's native reads and downloads (`sandboxes._helper._reads`), sent a step at a time:
other commands run while a big answer is on its way, and a file cut while it is sent hands the
download back to the script. The real helper over pipes, driven frame by frame, since what is
checked is when it sends what. (Their answers against the scripts': `native_writes`.)"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import wait_for

from sandboxes._mux.client import HEADER, PYTHON_FLAGS, SERVER_SOURCE, wire_spec

_F_SETPIPE_SZ = 1031


@pytest.fixture
def helper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        [sys.executable, *PYTHON_FLAGS, "-c", SERVER_SOURCE], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def _send(process: subprocess.Popen[bytes], *frames: tuple[bytes, int, dict[str, object]]) -> None:
    """``frames`` (kind, id, spec) in one write: the helper reads them in one go."""
    assert process.stdin is not None
    for kind, ident, payload in frames:
        data = wire_spec(payload)
        process.stdin.write(HEADER.pack(kind, ident, len(data)) + data)
    process.stdin.flush()


def _frame(process: subprocess.Popen[bytes]) -> tuple[bytes, int, bytes]:
    assert process.stdout is not None
    kind, ident, length = HEADER.unpack(process.stdout.read(HEADER.size))
    return kind, ident, process.stdout.read(length)


def _download(ident: int, *paths: Path) -> tuple[bytes, int, dict[str, object]]:
    return b"F", ident, {"op": ["download", "-", *map(str, paths)]}


def test_a_command_runs_while_a_download_is_on_its_way(helper: subprocess.Popen[bytes], tmp_path: Path) -> None:
    """The download and the command come in one write, the download first, and nothing is read
    from the helper until the command has run: a helper that sent the 4 MiB whole (as it did)
    stays blocked on the full pipe before it looks at the command, and never starts it; one
    that sends a step a turn starts it between two steps."""
    assert helper.stdout is not None
    fcntl.fcntl(helper.stdout.fileno(), _F_SETPIPE_SZ, 1 << 20)  # holds a step or more: not all 4 MiB
    big = tmp_path / "big"
    big.write_bytes(bytes(range(256)) * (16 << 10))
    marker = tmp_path / "ran"
    _send(helper, _download(1, big), (b"R", 2, {"command": f"touch {marker}", "env": {}}))
    wait_for(marker.exists, "the command did not run while the download was on its way")
    output, ended = bytearray(), {}
    while len(ended) < 2:
        kind, ident, payload = _frame(helper)
        if kind == b"O" and ident == 1:
            output += payload
        elif kind in b"XN":
            ended[ident] = (kind, payload)
    assert ended[2][0] == b"X"
    assert ended[1] == (b"X", b'{"code": 0, "timed_out": false}')
    assert bytes(output) == b"\0" + b"0 %d\n" % len(big.read_bytes()) + big.read_bytes()


def test_two_big_downloads_take_turns(helper: subprocess.Popen[bytes], tmp_path: Path) -> None:
    """Asked together, the second download's bytes start before the first one ends: each turn
    of the loop sends a step of the answers in flight in turn (a helper that sent answers whole
    sent all of the first first)."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_bytes(b"1" * (4 << 20))
    second.write_bytes(b"2" * (4 << 20))
    _send(helper, _download(1, first), _download(2, second))
    events, output = [], {1: bytearray(), 2: bytearray()}
    while sum(kind == b"X" for kind, _ in events) < 2:
        kind, ident, payload = _frame(helper)
        events.append((kind, ident))
        if kind == b"O":
            output[ident] += payload
    assert events.index((b"O", 2)) < events.index((b"X", 1)), "the second waited for the whole first"
    assert [bytes(output[i]) for i in (1, 2)] == [b"\0" + b"0 %d\n" % (4 << 20) + b * (4 << 20) for b in (b"1", b"2")]


def test_a_file_cut_while_it_is_sent_hands_the_download_back(helper: subprocess.Popen[bytes], tmp_path: Path) -> None:
    """Its length was announced and cannot be met: N, and the client runs the script (what came
    is dropped). The helper is at most a step and a pipe ahead of what was read, so the file is
    cut before it has read it all."""
    big = tmp_path / "big"
    big.write_bytes(b"x" * (32 << 20))
    _send(helper, _download(1, tmp_path / "missing", big))
    received = 0
    while received < 1 << 20:
        kind, ident, payload = _frame(helper)
        assert kind in b"AO", f"answered {kind!r} {payload[:100]!r} after {received} bytes"
        received += len(payload) if kind == b"O" else 0
    big.write_bytes(b"")
    while kind not in b"XNE":
        kind, ident, payload = _frame(helper)
        received += len(payload) if kind == b"O" else 0
    assert (kind, ident) == (b"N", 1)
    assert received < 4 << 20
    _send(helper, (b"R", 2, {"command": "echo served on", "env": {}}))
    answers = [_frame(helper) for _ in range(3)]
    assert [(kind, payload) for kind, _, payload in answers[1:]] == [
        (b"O", b"served on\n"),
        (b"X", b'{"code": 0, "timed_out": false}'),
    ]


def test_a_client_gone_while_a_download_is_sent_ends_the_helper_and_its_commands(tmp_path: Path) -> None:
    """The client stops reading in the middle of a download (closes its end; its input stays
    open): the helper's next write fails (EPIPE), and it ends as at the end of its input, its
    commands killed. Before, the failed write was a traceback that skipped the cleanup, and the
    command lived on."""
    process = subprocess.Popen(
        [sys.executable, *PYTHON_FLAGS, "-c", SERVER_SOURCE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        big = tmp_path / "big"
        big.write_bytes(b"x" * (32 << 20))
        _send(process, (b"R", 1, {"command": "echo $$; exec sleep 300", "env": {}}))
        kind, ident, payload = _frame(process)
        while kind != b"O":
            kind, ident, payload = _frame(process)
        pid = int(payload)
        _send(process, _download(2, big))
        while kind != b"O" or ident != 2:
            kind, ident, payload = _frame(process)
        assert process.stdout is not None
        process.stdout.close()  # its input stays open: the failed write alone must end it
        assert process.stderr is not None
        assert process.wait(timeout=30) == 0, process.stderr.read().decode(errors="replace")
        wait_for(lambda: not _alive(pid), f"the command ({pid}) outlived its helper")
    finally:
        process.kill()
        process.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, unreaped
    except FileNotFoundError:
        return False
