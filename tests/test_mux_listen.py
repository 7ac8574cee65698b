"""A listener held by the exec helper (`sandboxes._mux._listen`): a process of the sandbox
connects to 127.0.0.1:port, the helper accepts, the client adopts the connection as a relay and
the bytes go both ways. The pipe helper runs on the host, so this test plays the sandbox's
process on loopback."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import pytest
from test_mux import _TIMED, _VARIANTS, _PipeStream, _TimedPipeStream

from sandboxes._helper._relay import MAX_PENDING
from sandboxes._mux import MuxClient
from sandboxes._mux._listen import listen
from sandboxes._mux._relay import open_relay


@pytest.fixture(params=["posix_spawn+subreaper", _TIMED])
def client(request: pytest.FixtureRequest) -> Iterator[MuxClient]:
    stream = _TimedPipeStream() if request.param == _TIMED else _PipeStream(_VARIANTS[request.param])
    mux = MuxClient(stream)
    yield mux
    mux.close()
    stream.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_accepted_connections_are_adopted_and_carry_bytes_both_ways(client: MuxClient) -> None:
    port = _free_port()

    async def scenario() -> list[bytes]:
        loop = asyncio.get_running_loop()
        accepted: asyncio.Queue[int] = asyncio.Queue()
        listening = listen(client, port, lambda number: loop.call_soon_threadsafe(accepted.put_nowait, number))
        assert await asyncio.to_thread(listening.bound.wait, 10)

        async def serve_one() -> None:  # the "outside" end: upper-cases what the sandbox sent
            reader, writer = await open_relay(client, port, accepted=await accepted.get())
            data = await reader.read(1000)
            writer.write(data.upper())
            await writer.drain()
            writer.write_eof()

        def sandbox_process(text: bytes) -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(text)
                answer = b""
                while chunk := sock.recv(1000):
                    answer += chunk
                return answer

        servers = [asyncio.create_task(serve_one()) for _ in range(3)]
        answers = await asyncio.gather(*(asyncio.to_thread(sandbox_process, f"hello {i}".encode()) for i in range(3)))
        await asyncio.gather(*servers)
        listening.close()
        assert listening.channel is not None
        await listening.channel.wait_async()
        return sorted(answers)

    assert asyncio.run(scenario()) == [b"HELLO 0", b"HELLO 1", b"HELLO 2"]
    with pytest.raises(OSError):  # the listener is closed: nothing listens there now
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_a_port_that_cannot_be_bound_ends_the_listener_with_the_reason(client: MuxClient) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        listening = listen(client, port, lambda number: None)
        assert listening.channel is not None
        answer = listening.channel.wait(10)
    assert answer is not None
    assert answer.error is not None
    assert "Address already in use" in (answer.message or "")


def test_connections_nobody_adopts_are_bounded(client: MuxClient) -> None:
    port = _free_port()
    numbers: list[int] = []
    announced = threading.Condition()

    def on_accept(number: int) -> None:
        with announced:
            numbers.append(number)
            announced.notify_all()

    listening = listen(client, port, on_accept)
    assert listening.bound.wait(10)
    sockets = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(MAX_PENDING + 5)]
    try:
        for extra in sockets[-5:]:  # past the bound: closed by the helper, not left hanging
            extra.settimeout(10)
            assert extra.recv(10) == b""
        with announced:
            assert announced.wait_for(lambda: len(numbers) >= MAX_PENDING, timeout=10)
        assert len(numbers) == MAX_PENDING  # the ones closed were never announced
    finally:
        for sock in sockets:
            sock.close()
        listening.close()
