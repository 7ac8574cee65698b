"""The sync and async clients share one core free of I/O (`sandboxes.client._light.Attempts`,
the readers of `sandboxes.client._pump`): each case runs through both shells, over httpx's
mock transports, and both must answer alike."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest

from sandboxes import protocol as p
from sandboxes.client import (
    AsyncSandboxClient,
    CommandStream,
    NotFound,
    OutputChunk,
    SandboxClient,
    ServiceUnreachable,
)

Handler = Callable[[httpx.Request], httpx.Response]


def _both(handler: Handler, retries: int, call: str, *args: object) -> list[object]:
    """``call`` through a sync and an async client over ``handler``: each answer, or the
    exception's type."""
    outcomes: list[object] = []
    transport = httpx.MockTransport(handler)
    with SandboxClient("http://svc", "k", retries=retries, transport=transport, backoff=0.0, max_backoff=0.0) as c:
        try:
            outcomes.append(getattr(c, call)(*args))
        except Exception as exc:
            outcomes.append(type(exc))

    async def through_async() -> object:
        async with AsyncSandboxClient(
            "http://svc", "k", retries=retries, transport=httpx.MockTransport(handler), backoff=0.0, max_backoff=0.0
        ) as c:
            try:
                return await getattr(c, call)(*args)
            except Exception as exc:
                return type(exc)

    outcomes.append(asyncio.run(through_async()))
    return outcomes


def _counting(*answers: Callable[[httpx.Request], httpx.Response]) -> tuple[Handler, list[str]]:
    """A handler giving ``answers`` in turn (the last one again after them), and the requests seen."""
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        return answers[min(len(seen), len(answers)) - 1](request)

    return handler, seen


def _lost(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadError("reset", request=request)


def _unreachable(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("refused", request=request)


def _not_found(request: httpx.Request) -> httpx.Response:
    return httpx.Response(404, json={"error": "not_found", "message": "no such sandbox"})


@pytest.mark.parametrize("retries", [0, 1, 3])
def test_a_call_is_attempted_retries_plus_one_times_in_both_flavours(retries: int) -> None:
    handler, seen = _counting(_unreachable)
    assert _both(handler, retries, "list") == [ServiceUnreachable, ServiceUnreachable]
    assert len(seen) == 2 * (retries + 1)


def test_a_delete_whose_answer_was_lost_and_is_then_not_found_is_done_in_both_flavours() -> None:
    """The lost attempt deleted the sandbox: the retry's 404 is the delete's success."""
    handler, seen = _counting(_lost, _not_found, _lost, _not_found)
    assert _both(handler, 2, "delete", "sb") == [None, None]
    assert seen == ["DELETE /v1/sandboxes/sb"] * 4


def test_a_delete_not_found_at_once_raises_in_both_flavours() -> None:
    handler, seen = _counting(_not_found)
    assert _both(handler, 3, "delete", "sb") == [NotFound, NotFound]
    assert len(seen) == 2  # a NotFound is never retried


def test_a_retry_of_a_read_after_a_lost_answer_gives_the_answer_in_both_flavours() -> None:
    listed: dict[str, list[object]] = {"sandboxes": []}

    def ok(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=json.dumps(listed).encode())

    handler, seen = _counting(_lost, ok, _lost, ok)
    assert _both(handler, 1, "list") == [[], []]
    assert len(seen) == 4


def _lines(*events: dict[str, object]) -> bytes:
    return b"".join(json.dumps(event).encode() + b"\n" for event in events)


def _routes(answers: dict[str, bytes]) -> tuple[Handler, list[str]]:
    """A handler answering each ``METHOD path`` with its NDJSON body, and the requests seen."""
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}?{request.url.query.decode()}")
        return httpx.Response(200, content=answers[f"{request.method} {request.url.path}"])

    return handler, seen


Watched = tuple[list[tuple[str, str | None]], object, object]
"""A watch read to its end: its events (type and name), then its error and message."""


def _watched(handler: Handler) -> list[Watched]:
    """Each flavour's watch of ``/w`` read to its end: its events, then its error and message."""
    with SandboxClient("http://svc", "k", transport=httpx.MockTransport(handler)) as c:
        with c.attach("sb").watch("/w") as stream:
            events: list[tuple[str, str | None]] = [(event.type, event.name) for event in stream]
        outcomes: list[Watched] = [(events, stream.error, stream.message)]

    async def through_async() -> Watched:
        async with AsyncSandboxClient("http://svc", "k", transport=httpx.MockTransport(handler)) as c:
            async with await c.attach("sb").awatch("/w") as stream:
                events: list[tuple[str, str | None]] = [(event.type, event.name) async for event in stream]
            return events, stream.error, stream.message

    outcomes.append(asyncio.run(through_async()))
    return outcomes


def test_a_watch_skips_what_it_does_not_know_and_ends_with_its_end_in_both_flavours() -> None:
    body = _lines(
        {"type": "start"},
        {"type": "keepalive"},
        {"type": "create", "name": "a"},
        {"type": "moved-by-a-newer-service", "name": "?"},
        {"type": "write", "name": "a"},
        {"type": "end", "error": "timeout", "message": "the watch's time is up"},
        {"type": "create", "name": "after the end"},
    )
    handler, _ = _routes({"GET /v1/sandboxes/sb/watch": body})
    expected = ([("create", "a"), ("write", "a")], "timeout", "the watch's time is up")
    assert _watched(handler) == [expected, expected]


def test_a_watch_whose_stream_ends_first_is_lost_in_both_flavours() -> None:
    handler, _ = _routes({"GET /v1/sandboxes/sb/watch": _lines({"type": "start"}, {"type": "create", "name": "a"})})
    lost = ([("create", "a")], "connection_lost", "GET /v1/sandboxes/sb/watch: the stream ended before the watch did")
    assert _watched(handler) == [lost, lost]


def test_a_stream_with_a_malformed_line_is_followed_again_from_its_offset_in_both_flavours() -> None:
    first = (
        _lines(
            {"type": "output", "data": "", "id": "c1", "offset": 0},
            {"type": "output", "data": "one\n", "offset": 4},
            {"type": "output", "data": "err\n", "offset": 8, "stream": "stderr"},
        )
        + b"{not json\n"
        + _lines({"type": "output", "data": "never seen\n", "offset": 19})
    )
    rest = _lines(
        {"type": "output", "data": "two\n", "offset": 12},
        {"type": "exit", "result": {"output": "one\nerr\ntwo\n", "exit_code": 0}},
    )
    handler, seen = _routes(
        {"POST /v1/sandboxes/sb/execute/stream": first, "GET /v1/sandboxes/sb/execute/c1/stream": rest}
    )
    with SandboxClient("http://svc", "k", transport=httpx.MockTransport(handler)) as c:
        sync = _read_stream(c.attach("sb").execute_stream("echo"))

    async def through_async() -> Followed:
        async with AsyncSandboxClient("http://svc", "k", transport=httpx.MockTransport(handler)) as c:
            stream = c.attach("sb").aexecute_stream("echo")
            items = [_shown(item) async for item in stream]
            return items, stream.command_id, stream.offset

    asynchronous = asyncio.run(through_async())
    assert sync == asynchronous
    items, command_id, offset = sync
    assert items[:-1] == [("one\n", "stdout"), ("err\n", "stderr"), ("two\n", "stdout")]
    assert isinstance(items[-1], p.ExecuteResponse)
    assert items[-1].output == "one\nerr\ntwo\n"
    assert (command_id, offset) == ("c1", 12)
    assert seen == ["POST /v1/sandboxes/sb/execute/stream?", "GET /v1/sandboxes/sb/execute/c1/stream?offset=8"] * 2


Followed = tuple[list[object], str | None, int]
"""A followed stream's items (a chunk as its text and stream), then its command id and offset."""


def _shown(item: OutputChunk | p.ExecuteResponse) -> object:
    return (str(item), item.stream) if isinstance(item, OutputChunk) else item


def _read_stream(stream: CommandStream) -> Followed:
    return [_shown(item) for item in stream], stream.command_id, stream.offset
