"""`sandboxes.docker._io.ExecSocket` over a real socket pair, fed the frames Docker multiplexes
a ``docker exec`` into (stream id, 3 bytes padding, length): how the exec helper's client reads
its bursts."""

from __future__ import annotations

import socket
import struct
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxes.docker._io import ExecSocket

STDOUT, STDERR = 1, 2


def frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(payload)) + payload


class CountingSocket(socket.socket):
    """A real socket that counts its ``recv`` calls (the system calls a read costs)."""

    recvs = 0

    def recv(self, size: int, flags: int = 0) -> bytes:
        self.recvs += 1
        return super().recv(size, flags)


@pytest.fixture
def pair() -> Iterator[tuple[CountingSocket, socket.socket]]:
    ours, theirs = socket.socketpair()
    counted = CountingSocket(fileno=ours.detach())
    try:
        yield counted, theirs
    finally:
        counted.close()
        theirs.close()


def test_a_burst_of_frames_is_one_read_and_one_piece(pair: tuple[CountingSocket, socket.socket]) -> None:
    counted, peer = pair
    stream = ExecSocket(counted)
    peer.sendall(frame(STDOUT, b"one") + frame(STDERR, b"noise") + frame(STDOUT, b"two") + frame(STDOUT, b"three"))
    assert stream.recv(65536) == b"onetwothree"
    assert counted.recvs == 1
    assert bytes(stream.stderr) == b"noise"


def test_what_is_in_hand_comes_back_without_waiting_for_a_partial_frame(
    pair: tuple[CountingSocket, socket.socket],
) -> None:
    counted, peer = pair
    stream = ExecSocket(counted)
    second = frame(STDOUT, b"second")
    peer.sendall(frame(STDOUT, b"first") + second[:3])  # half a header follows the first frame
    assert stream.recv(65536) == b"first"
    peer.sendall(second[3:])
    assert stream.recv(65536) == b"second"


def test_a_frame_body_split_across_reads_arrives_in_order(pair: tuple[CountingSocket, socket.socket]) -> None:
    counted, peer = pair
    stream = ExecSocket(counted)
    whole = frame(STDOUT, b"abcdefgh")
    peer.sendall(whole[:11])
    assert stream.recv(65536) == b"abc"
    peer.sendall(whole[11:])
    assert stream.recv(65536) == b"defgh"


def test_the_size_asked_is_never_exceeded(pair: tuple[CountingSocket, socket.socket]) -> None:
    counted, peer = pair
    stream = ExecSocket(counted)
    peer.sendall(frame(STDOUT, b"0123456789") + frame(STDOUT, b"ab"))
    assert stream.recv(4) == b"0123"
    assert stream.recv(7) == b"456789a"
    assert stream.recv(7) == b"b"


def test_end_of_stream_after_the_last_frame(pair: tuple[CountingSocket, socket.socket]) -> None:
    counted, peer = pair
    stream = ExecSocket(counted)
    peer.sendall(frame(STDOUT, b"last"))
    peer.shutdown(socket.SHUT_WR)
    assert stream.recv(65536) == b"last"
    assert stream.recv(65536) == b""


def test_merged_stderr_keeps_the_order_written(pair: tuple[CountingSocket, socket.socket]) -> None:
    counted, peer = pair
    stream = ExecSocket(counted, merge_stderr=True)
    peer.sendall(frame(STDOUT, b"out,") + frame(STDERR, b"err,") + frame(STDOUT, b"out"))
    assert stream.recv(65536) == b"out,err,out"
    assert stream.stderr == b""


def test_a_frame_bigger_than_the_socket_buffer_arrives_whole(pair: tuple[CountingSocket, socket.socket]) -> None:
    """A big file's output (`read_exec_stdout` asks 1 MiB at a time), written as it is read."""
    counted, peer = pair
    stream = ExecSocket(counted)
    payload = bytes(range(256)) * 2048  # 512 KiB
    writer = threading.Thread(target=peer.sendall, args=(frame(STDOUT, payload),))
    writer.start()
    got = b""
    while len(got) < len(payload):
        chunk = stream.recv(1 << 20)
        assert chunk
        got += chunk
    writer.join()
    assert got == payload


def _blocked(thread: threading.Thread) -> bool:
    """Whether ``thread`` waits in the kernel for a unix socket's data (not for the interpreter lock)."""
    return Path(f"/proc/self/task/{thread.native_id}/wchan").read_text() == "unix_stream_read_generic"


def test_a_reader_waiting_for_data_holds_no_read_buffer() -> None:
    """An idle exec helper's reader waits for good: what it holds while it waits is held for
    every idle sandbox, so it waits without the buffer of the read that follows."""
    ours, peer = socket.socketpair()
    stream = ExecSocket(ours)
    got: list[bytes] = []
    tracemalloc.start(16)
    try:
        reader = threading.Thread(target=lambda: got.append(stream.recv(65536)), daemon=True)
        reader.start()
        deadline = time.monotonic() + 10
        while not _blocked(reader) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert _blocked(reader), "the reader never waited for data"
        ours = tracemalloc.Filter(True, "*/sandboxes/docker/_io.py", all_frames=True)
        held = tracemalloc.take_snapshot().filter_traces([ours])
    finally:
        tracemalloc.stop()
    assert sum(stat.size for stat in held.statistics("filename")) < 4096
    peer.sendall(frame(STDOUT, b"woken"))
    reader.join(10)
    assert got == [b"woken"]
    peer.close()
    assert stream.recv(65536) == b""
    stream.close()
