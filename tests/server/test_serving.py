"""`sandboxes.server.serving`: the stack the service is served with, and responses of known
length written in one piece, over real sockets under a real uvicorn.

The server's transport is wrapped twice, as in `serving._one_piece`, with a recorder beneath
`_OnePiece`: what the recorder sees is what reached the socket, write by write."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sandboxes.server import serving

WRITES: list[bytes] = []


class _Recorder:
    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def write(self, data: bytes) -> None:
        WRITES.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Recorded(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(serving._OnePiece(_Recorder(transport)))  # type: ignore[arg-type]


async def _json(request: Request) -> Response:
    return JSONResponse({"hello": "world" * int(request.query_params.get("n", "1"))})


async def _stream(request: Request) -> Response:
    async def chunks() -> AsyncIterator[bytes]:
        await asyncio.sleep(2)
        yield b"first\n"
        await asyncio.sleep(0.1)
        yield b"second\n"

    return StreamingResponse(chunks(), media_type="text/plain")


async def _ready_stream(request: Request) -> Response:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"first\n"  # at once, as a Connect stream's first envelope
        await asyncio.sleep(0.1)
        yield b"second\n"

    return StreamingResponse(chunks(), media_type="text/plain")


APP = Starlette(
    routes=[
        Route("/json", _json, methods=["GET", "HEAD"]),
        Route("/stream", _stream),
        Route("/ready-stream", _ready_stream),
    ]
)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(APP, host="127.0.0.1", port=port, http=_Recorded, log_config=None, lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_a_response_of_known_length_is_one_write(url: str) -> None:
    with httpx.Client(base_url=url) as client:
        for n in (1, 10_000):  # a small body and one of 50 kB
            WRITES.clear()
            response = client.get("/json", params={"n": n})
            assert response.json() == {"hello": "world" * n}
            assert len(WRITES) == 1
            assert WRITES[0].startswith(b"HTTP/1.1 200 OK\r\n")
            assert WRITES[0].endswith(response.content)


def test_a_big_body_is_not_copied_behind_its_head(url: str) -> None:
    with httpx.Client(base_url=url) as client:
        WRITES.clear()
        response = client.get("/json", params={"n": 30_000})  # 150 kB
        assert response.json() == {"hello": "world" * 30_000}
    assert len(WRITES) == 2
    assert WRITES[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert WRITES[0].endswith(b"\r\n\r\n")
    assert WRITES[1] == response.content


def test_keep_alive_requests_each_get_their_whole_answer(url: str) -> None:
    with httpx.Client(base_url=url) as client:
        WRITES.clear()
        answers = [client.get("/json", params={"n": n}).json() for n in range(1, 30)]
    assert answers == [{"hello": "world" * n} for n in range(1, 30)]
    assert len(WRITES) == 29


def test_a_head_request_without_a_body_still_gets_its_head(url: str) -> None:
    with httpx.Client(base_url=url, timeout=5) as client:
        WRITES.clear()
        started = time.monotonic()
        response = client.head("/json")
        assert time.monotonic() - started < 1  # not at the keep-alive timeout, when the server closes
        assert response.status_code == 200
        assert int(response.headers["content-length"]) > 0
        assert len(WRITES) == 1
        assert WRITES[0].endswith(b"\r\n\r\n")  # the head alone, sent at the end of its turn


def test_a_streamed_response_head_is_not_held_for_its_output(url: str) -> None:
    with httpx.Client(base_url=url) as client:
        WRITES.clear()
        started = time.monotonic()
        with client.stream("GET", "/stream") as response:
            head_after = time.monotonic() - started
            assert response.headers["transfer-encoding"] == "chunked"
            body = response.read()
    assert head_after < 1.5  # before the first chunk, which comes after 2 s
    assert body == b"first\nsecond\n"
    assert WRITES[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert WRITES[0].endswith(b"\r\n\r\n")
    assert len(WRITES) >= 3


def test_the_service_is_served_with_the_fast_stack_in_one_piece() -> None:
    """httptools and uvloop come with the ``server`` extra; without them it would still run."""
    assert importlib.util.find_spec("httptools")
    assert importlib.util.find_spec("uvloop")
    config = serving.uvicorn_config(APP, host="127.0.0.1", port=0, drain_timeout=3)
    assert config.loop == "uvloop"
    assert isinstance(config.http, type)
    assert issubclass(config.http, HttpToolsProtocol)
    assert config.http.__name__ == "OnePieceBoundedHeadHttpToolsProtocol"
    assert (config.access_log, config.lifespan, config.timeout_graceful_shutdown) == (False, "on", 3)


def test_the_collector_leaves_the_set_up_service_alone() -> None:
    """`serving.collect_less`, in a process of its own: it changes the interpreter's collector."""
    probe = (
        "import gc\nfrom sandboxes.server import serving\nserving.collect_less()\n"
        "print(gc.get_threshold()[0], gc.get_freeze_count() > 1000, gc.get_count()[2])"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == [str(serving.YOUNG_COLLECTION_THRESHOLD), "True", "0"]


def test_a_streamed_head_goes_with_output_already_there(url: str) -> None:
    """A stream whose first chunk is ready in the same turn: the head and that chunk in one write."""
    with httpx.Client(base_url=url) as client:
        WRITES.clear()
        with client.stream("GET", "/ready-stream") as response:
            assert response.headers["transfer-encoding"] == "chunked"
            body = response.read()
    assert body == b"first\nsecond\n"
    assert WRITES[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert WRITES[0].endswith(b"\r\n\r\n6\r\nfirst\n\r\n")
    assert WRITES[1:] == [b"7\r\nsecond\n\r\n", b"0\r\n\r\n"]


def test_the_service_keeps_an_idle_connection_longer_than_the_proxies_in_front() -> None:
    """A connection idle for less than the common proxy and client timeouts (60 s) is never
    closed by the service under a request being sent on it."""
    config = serving.uvicorn_config(APP, host="127.0.0.1", port=0, drain_timeout=5)
    assert config.timeout_keep_alive == serving.KEEP_ALIVE > 60
