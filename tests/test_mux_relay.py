"""A relayed connection (`sandboxes._mux._relay`): the exec helper connects to a port on
127.0.0.1 and relays the bytes both ways over its stream, flow-controlled, on every stream
variant of the helper. The pipe helper runs on the host, so the servers here are the test's own,
on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_mux import _TIMED, _VARIANTS, _PipeStream, _TimedPipeStream

from sandboxes._helper.frames import GRANT, STDIN
from sandboxes._mux import Command, MuxClient
from sandboxes._mux._relay import WINDOW, _Relayed, connect_relay, open_relay

Handler = Callable[[socket.socket], None]


@pytest.fixture(params=[*_VARIANTS, _TIMED])
def pipe(request: pytest.FixtureRequest) -> Iterator[_PipeStream]:
    stream = _TimedPipeStream() if request.param == _TIMED else _PipeStream(_VARIANTS[request.param])
    yield stream
    stream.close()


_NO_SPLICE = "no splice"
"""The helper where Python has no `os.splice` (before 3.10): a socket's bytes are read into its
memory and written from there, instead of spliced through a pipe of its own."""


@pytest.fixture(params=["posix_spawn+subreaper", _TIMED, _NO_SPLICE])
def big_pipe(request: pytest.FixtureRequest) -> Iterator[_PipeStream]:
    """The two ways the client reads (its reader thread always, or callers in turn), and the two
    ways the helper reads a socket: what the flow control depends on. The spawn variants only
    change how commands start."""
    if request.param == _TIMED:
        stream: _PipeStream = _TimedPipeStream()
    else:
        stream = _PipeStream("import os\ndel os.splice\n" if request.param == _NO_SPLICE else "")
    yield stream
    stream.close()


@pytest.fixture
def client(pipe: _PipeStream) -> Iterator[MuxClient]:
    mux = MuxClient(pipe)
    yield mux
    mux.close()


class _Server:
    """A TCP server on 127.0.0.1 serving each connection with ``handler`` on a thread of its own."""

    def __init__(self, handler: Handler) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._handler = handler
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            self._handler(conn)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not)
        self.listener.close()
        self._accepting.join(10)
        for thread in self._threads:
            thread.join(10)


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], _Server]]:
    servers: list[_Server] = []

    def start(handler: Handler) -> _Server:
        servers.append(_Server(handler))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _echo(conn: socket.socket) -> None:
    while data := conn.recv(65536):
        conn.sendall(data)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _pattern(size: int, seed: bytes) -> bytes:
    block = hashlib.sha256(seed).digest() * 2048  # 64 KiB
    return (block * (size // len(block) + 1))[:size]


def _hwm_kib(pid: int) -> int:
    """The process's peak resident memory (VmHWM), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_bytes_echo_both_ways_and_the_ends_close_in_order(
    client: MuxClient, serve: Callable[[Handler], _Server]
) -> None:
    server = serve(_echo)
    with connect_relay(client, server.port, timeout=10) as conn:
        conn.sendall(b"hello relay")
        got = b""
        while len(got) < 11:
            got += conn.recv(100)
        assert got == b"hello relay"
        conn.shutdown_write()  # the server sees EOF, closes: the relay's read ends
        assert conn.recv(100) == b""
    assert client.alive


def test_a_port_nothing_listens_on_is_refused_clearly(client: MuxClient) -> None:
    port = _free_port()
    with pytest.raises(ConnectionRefusedError, match=f"nothing listens on port {port}"):
        connect_relay(client, port, timeout=10)
    assert client.run(Command("echo still", timeout=10, output_limit=100)).output == "still\n"


def test_a_relay_on_an_event_loop(client: MuxClient, serve: Callable[[Handler], _Server]) -> None:
    server = serve(_echo)

    async def scenario() -> bytes:
        reader, writer = await open_relay(client, server.port)
        writer.write(b"x" * 300_000)
        await writer.drain()
        got = await reader.readexactly(300_000)
        writer.write_eof()
        assert await reader.read() == b""
        writer.close()
        return got

    assert asyncio.run(scenario()) == b"x" * 300_000


def test_twenty_mib_both_ways_with_slow_readers_stay_within_the_windows(
    big_pipe: _PipeStream, serve: Callable[[Handler], _Server]
) -> None:
    """Each side reads slowly; the other side's writes wait for its grants: the helper (whose
    memory is measured) and the client never hold more than a window of the connection."""
    size = 20 << 20
    down, up = _pattern(size, b"down"), _pattern(size, b"up")
    received = hashlib.sha256()
    all_received = threading.Event()

    def handler(conn: socket.socket) -> None:
        sender = threading.Thread(target=lambda: (conn.sendall(down), conn.shutdown(socket.SHUT_WR)))
        sender.start()
        while data := conn.recv(16384):
            received.update(data)
            time.sleep(0.0005)  # a slow consumer, not a wait for an event
        all_received.set()
        sender.join()

    server, echoing = serve(handler), serve(_echo)
    mux = MuxClient(big_pipe)
    try:
        with connect_relay(mux, echoing.port, timeout=10) as warm:  # the helper's relay code, loaded
            warm.shutdown_write()
            assert warm.recv(1) == b""
        baseline = _hwm_kib(big_pipe.process.pid)
        conn = connect_relay(mux, server.port, timeout=30)
        writer = threading.Thread(target=lambda: (conn.sendall(up), conn.shutdown_write()))
        writer.start()
        got, most_buffered = hashlib.sha256(), 0
        total = 0
        while chunk := conn.recv(16384):
            got.update(chunk)
            total += len(chunk)
            most_buffered = max(most_buffered, conn._relayed._buffered)
            time.sleep(0.0005)  # a slow consumer
        writer.join(60)
        conn.close()
        assert total == size
        assert got.digest() == hashlib.sha256(down).digest()
        assert all_received.wait(30)
        assert received.digest() == hashlib.sha256(up).digest()
        assert most_buffered <= WINDOW
        grown = _hwm_kib(big_pipe.process.pid) - baseline
        assert grown < 8 << 10, f"the helper grew by {grown} KiB relaying 20 MiB each way"
    finally:
        mux.close()


def test_a_download_is_granted_back_in_quarters_of_the_window_not_per_chunk(
    big_pipe: _PipeStream, serve: Callable[[Handler], _Server]
) -> None:
    """Each grant is a frame, a write on the helper's stream and a turn of its loop: the client
    grants what its consumer took once a quarter of the window adds up, however small the
    chunks and however fast the consumer."""
    size = 4 << 20
    payload = _pattern(size, b"granted")
    server = serve(lambda conn: conn.sendall(payload))
    mux = MuxClient(big_pipe)
    try:
        conn = connect_relay(mux, server.port, timeout=30)
        channel = conn._relayed.channel
        grants: list[int] = []
        send = channel.send

        def counted(kind: bytes, data: bytes = b"") -> None:
            if kind == GRANT:
                grants.append(int.from_bytes(data, "big"))
            send(kind, data)

        channel.send = counted  # type: ignore[method-assign]
        got = hashlib.sha256()
        total = 0
        while chunk := conn.recv(1 << 20):
            got.update(chunk)
            total += len(chunk)
        conn.close()
        assert total == size
        assert got.digest() == hashlib.sha256(payload).digest()
        assert len(grants) <= size // (WINDOW // 4), grants
        assert all(grant >= WINDOW // 4 for grant in grants), grants
    finally:
        mux.close()


def test_an_upload_is_granted_back_in_quarters_of_the_window_not_per_frame(
    client: MuxClient, serve: Callable[[Handler], _Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The helper grants what it wrote of the client's bytes once a quarter of the window adds
    up, however small the client's frames: a grant is a frame, a write on the helper's stream
    and a wake-up of the client's reader. Every byte still arrives, in order."""
    size = 4 << 20
    payload = _pattern(size, b"granted up")
    received = hashlib.sha256()

    def handler(conn: socket.socket) -> None:
        while data := conn.recv(1 << 16):
            received.update(data)
        conn.sendall(b"k")

    grants: list[int] = []
    framed = _Relayed._framed

    def counted(self: _Relayed, kind: bytes, payload: bytes) -> None:
        if kind == GRANT:
            grants.append(int.from_bytes(payload, "big"))
        framed(self, kind, payload)

    monkeypatch.setattr(_Relayed, "_framed", counted)
    server = serve(handler)
    with connect_relay(client, server.port, timeout=30) as conn:
        view = memoryview(payload)
        for start in range(0, size, 16 << 10):  # frames of 16 KiB
            conn.sendall(view[start : start + (16 << 10)])
        conn.shutdown_write()
        assert conn.recv(1) == b"k"
    assert received.digest() == hashlib.sha256(payload).digest()
    assert grants[0] == WINDOW  # once connected: the whole window
    assert all(grant >= WINDOW // 4 for grant in grants[1:]), grants
    assert len(grants) <= 1 + size // (WINDOW // 4), grants


def test_the_helper_widens_its_pipes_for_a_relay(
    client: MuxClient, pipe: _PipeStream, serve: Callable[[Handler], _Server]
) -> None:
    """A relay's bytes cross the helper's stdin and stdout: a pipe of 256 KiB takes a frame in
    one write, where the default 64 KiB took four."""
    server = serve(_echo)
    with connect_relay(client, server.port, timeout=10) as conn:
        conn.sendall(b"wide")
        assert conn.recv(4) == b"wide"
    assert pipe.process.stdin is not None
    assert pipe.process.stdout is not None
    for end in (pipe.process.stdin, pipe.process.stdout):
        assert fcntl.fcntl(end.fileno(), fcntl.F_GETPIPE_SZ) == 256 << 10


def test_bytes_sent_just_before_a_close_still_reach_the_server(
    client: MuxClient, serve: Callable[[Handler], _Server]
) -> None:
    """The helper writes the frames of one read of its stream together; a close (K) among them
    still writes what came before it, as a socket's close after a send does."""
    payload = _pattern(100_000, b"last words")
    received: list[bytes] = []
    ended = threading.Event()

    def handler(conn: socket.socket) -> None:
        while data := conn.recv(65536):
            received.append(data)
        ended.set()

    server = serve(handler)
    conn = connect_relay(client, server.port, timeout=10)
    conn.sendall(payload)
    conn.close()
    assert ended.wait(10)
    assert b"".join(received) == payload


def test_fifty_connections_at_once(client: MuxClient, serve: Callable[[Handler], _Server]) -> None:
    server = serve(_echo)

    def one(index: int) -> bytes:
        payload = _pattern(100_000 + index, str(index).encode())
        with connect_relay(client, server.port, timeout=30) as conn:
            conn.sendall(payload)
            conn.shutdown_write()
            parts = []
            while chunk := conn.recv(65536):
                parts.append(chunk)
        assert b"".join(parts) == payload
        return payload

    with ThreadPoolExecutor(50) as pool:
        assert len(list(pool.map(one, range(50)))) == 50


def test_a_stalled_relay_stalls_neither_commands_nor_other_relays(
    client: MuxClient, serve: Callable[[Handler], _Server]
) -> None:
    def flood(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(b"z" * (8 << 20))

    flooding = serve(flood)
    echoing = serve(_echo)
    stalled = connect_relay(client, flooding.port, timeout=10)
    relayed = stalled._relayed
    relayed.wait(lambda: relayed._buffered >= WINDOW - 65536, time.monotonic() + 10)  # its window is spent
    started = time.monotonic()
    answer = client.run(Command("echo beside", timeout=10, output_limit=100))
    assert answer.output == "beside\n"
    with connect_relay(client, echoing.port, timeout=10) as other:
        other.sendall(b"ping")
        assert other.recv(4) == b"ping"
    assert time.monotonic() - started < 5
    assert relayed._buffered <= WINDOW
    stalled.close()


def test_a_saturating_relay_stalls_neither_commands_nor_other_relays(
    client: MuxClient, serve: Callable[[Handler], _Server]
) -> None:
    def flood(conn: socket.socket) -> None:  # as fast as the relay takes it, until it closes
        block = b"s" * (1 << 20)
        with contextlib.suppress(OSError):
            while True:
                conn.sendall(block)

    flooding = serve(flood)
    echoing = serve(_echo)
    received = [0]
    saturating, stopped = threading.Event(), threading.Event()
    relay = connect_relay(client, flooding.port, timeout=10)

    def drink() -> None:  # the relay's consumer, reading as fast as it can
        with contextlib.suppress(ConnectionError):
            while not stopped.is_set() and (chunk := relay.recv(1 << 20)):
                received[0] += len(chunk)
                if received[0] >= 4 * WINDOW:
                    saturating.set()

    reader = threading.Thread(target=drink, daemon=True)
    reader.start()
    try:
        assert saturating.wait(30), f"the relay never moved {4 * WINDOW} bytes (moved {received[0]})"
        for turn in range(3):
            before = received[0]
            answer = client.run(Command(f"echo beside {turn}", timeout=10, output_limit=100))
            assert answer.output == f"beside {turn}\n"
            with connect_relay(client, echoing.port, timeout=10) as other:
                other.sendall(b"ping")
                assert other.recv(4) == b"ping"
            assert reader.is_alive()  # the relay went on meanwhile, and goes on
            deadline = time.monotonic() + 10
            while received[0] == before:
                assert time.monotonic() < deadline, "the relay stopped moving beside the commands"
                time.sleep(0.01)
    finally:
        stopped.set()
        relay.close()
        reader.join(10)
    assert not reader.is_alive()


def test_an_upload_goes_a_window_ahead_in_frames_the_helpers_pipe_takes_whole(
    big_pipe: _PipeStream, serve: Callable[[Handler], _Server]
) -> None:
    """The helper lets the client send its whole window ahead (what it granted once connected),
    and the client's bytes go in frames of 256 KiB with their header, not 64 KiB: four times
    fewer writes, reads and turns of the helper's loop; every byte arrives, in order."""
    size = 4 << 20
    payload = _pattern(size, b"uploaded")
    received = hashlib.sha256()
    count = [0]
    ended = threading.Event()

    def handler(conn: socket.socket) -> None:
        while data := conn.recv(1 << 16):
            received.update(data)
            count[0] += len(data)
        conn.sendall(b"k")
        ended.set()

    server = serve(handler)
    mux = MuxClient(big_pipe)
    try:
        conn = connect_relay(mux, server.port, timeout=30)
        relayed = conn._relayed
        assert relayed._credit == WINDOW  # the helper's first grant: the client's whole window
        frames: list[int] = []
        send = relayed.channel.send

        def counted(kind: bytes, data: bytes | memoryview = b"") -> None:
            if kind == STDIN:
                frames.append(len(data))
            send(kind, data)

        relayed.channel.send = counted  # type: ignore[method-assign]
        conn.sendall(payload)
        conn.shutdown_write()
        assert conn.recv(1) == b"k"
        assert ended.wait(30)
        conn.close()
        assert count[0] == size
        assert received.digest() == hashlib.sha256(payload).digest()
        assert max(frames) == (256 << 10) - 9, frames[:5]
        assert len(frames) <= size // ((256 << 10) - 9) + 8, len(frames)
    finally:
        mux.close()


def _bytes_read(pid: int) -> int:
    """What the process read by read system calls (``rchar``: a splice moves bytes past it)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


@pytest.mark.parametrize("splice", [True, False], ids=["splice", "no splice"])
def test_an_upload_is_spliced_from_the_helpers_stdin_to_the_socket(
    splice: bool, serve: Callable[[Handler], _Server]
) -> None:
    """Where Python has `os.splice`, a relay's upload goes from the helper's stdin to the socket
    through the kernel, not through the helper's reads; without it, through them. Either way
    every byte arrives, in order."""
    size = 8 << 20
    payload = _pattern(size, b"spliced up")
    received = hashlib.sha256()
    count = [0]

    def handler(conn: socket.socket) -> None:
        while data := conn.recv(1 << 16):
            received.update(data)
            count[0] += len(data)
        conn.sendall(b"k")

    server = serve(handler)
    stream = _PipeStream("" if splice else "import os\ndel os.splice\n")
    mux = MuxClient(stream)
    try:
        conn = connect_relay(mux, server.port, timeout=30)
        before = _bytes_read(stream.process.pid)
        conn.sendall(payload)
        conn.shutdown_write()
        assert conn.recv(1) == b"k"
        read = _bytes_read(stream.process.pid) - before
        conn.close()
        assert count[0] == size
        assert received.digest() == hashlib.sha256(payload).digest()
        if splice:
            assert read < size // 2, f"the helper read {read} bytes of an upload of {size}"
        else:
            assert read >= size
    finally:
        mux.close()
        stream.close()


def test_a_drain_cancelled_midway_sends_no_byte_twice(client: MuxClient, serve: Callable[[Handler], _Server]) -> None:
    """A drain that times out while the server does not read (the window spent) leaves the rest
    queued; the next drain sends only that rest: the server gets every byte once, in order."""
    size = 24 << 20
    payload = _pattern(size, b"drained")
    reading = threading.Event()
    received = hashlib.sha256()
    count = [0]

    def handler(conn: socket.socket) -> None:
        reading.wait(30)
        while data := conn.recv(1 << 16):
            received.update(data)
            count[0] += len(data)
        conn.sendall(b"k")

    server = serve(handler)

    async def scenario() -> bytes:
        reader, writer = await open_relay(client, server.port)
        writer.write(payload)
        with pytest.raises(TimeoutError):  # the server's buffers and the window are full
            await asyncio.wait_for(writer.drain(), 1.0)
        reading.set()
        await writer.drain()
        writer.write_eof()
        answer = await reader.readexactly(1)
        writer.close()
        return answer

    assert asyncio.run(scenario()) == b"k"
    assert count[0] == size
    assert received.digest() == hashlib.sha256(payload).digest()
