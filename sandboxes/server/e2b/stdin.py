"""A command's stdin as envd serves it: ``Start`` with ``stdin: true`` runs the command on a
channel of the sandbox's exec helper (`sandboxes._mux.open_channel`), its stdin held open,
and ``SendInput`` (one chunk), ``StreamInput`` (chunks as a client stream sends them) and
``CloseStdin`` (its end) reach it by pid. A sandbox without a helper runs the command on the
service's own path with its stdin closed, and its input calls answer ``failed_precondition``.
A terminal's (``Start`` with a ``pty``) takes ``SendInput`` and ``StreamInput`` as typed keys
(``input.pty``, `sandboxes.server.e2b.pty`)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from sandboxes import protocol as p
from sandboxes._mux import Channel, HoldsHelper, MuxBroken, open_channel
from sandboxes._output import OutputHook
from sandboxes.server.e2b.common import ENVD_PREFIX, E2BRoute, e2b_state
from sandboxes.server.e2b.connect import (
    HTTP_STATUS,
    STREAM_MEDIA_TYPE,
    ConnectError,
    end_of_stream,
    envelope,
    parse_message,
    unary_message,
)
from sandboxes.server.e2b.envd import access
from sandboxes.server.e2b.pty import send_pty_input, terminal_of
from sandboxes.server.e2b.running import Running
from sandboxes.server.logs import unique_id
from sandboxes.server.processes import Command
from sandboxes.server.registry import Entry

__all__ = ["MAX_INPUT_MESSAGE", "open_with_stdin", "router"]

router = APIRouter(prefix=ENVD_PREFIX, route_class=E2BRoute, include_in_schema=False)

MAX_INPUT_MESSAGE = 4 << 20
"""The largest message of a ``StreamInput`` (bytes of its envelope); a larger one ends the
stream with ``resource_exhausted``, before it is buffered."""
_HEADER = struct.Struct(">BI")


async def open_with_stdin(
    entry: Entry, command: Command, on_output: OutputHook, on_end: Callable[[], None]
) -> tuple[asyncio.Future[p.ExecuteResponse], str, Channel] | None:
    """``command`` on a channel of the sandbox's exec helper, marked (for a kill from outside
    the helper) by the token returned with it; ``None`` if the sandbox has no helper to hold one
    (nothing ran, ``on_end`` not called). ``on_end`` runs once it ended, or at once if it could
    not start (`ConnectError` ``unavailable``)."""
    try:
        channel, token = await _opened(entry, command, on_output)
    except BaseException:
        on_end()
        raise
    if channel is None:
        return None
    work = asyncio.ensure_future(channel.wait_async())
    work.add_done_callback(lambda _: on_end())
    return work, token, channel


async def _opened(entry: Entry, command: Command, on_output: OutputHook) -> tuple[Channel | None, str]:
    from sandboxes.server.backends import MARKER_ENV

    sandbox = entry.sandbox
    mux = await asyncio.to_thread(sandbox.exec_helper) if isinstance(sandbox, HoldsHelper) else None
    token = unique_id()
    if mux is None:
        return None, token
    cwd = command.cwd or entry.state.workdir or None
    # its output goes to `on_output` as it comes; the answer keeps none
    opened = replace(command.with_env(MARKER_ENV, token), output_limit=0, cwd=cwd)
    try:
        channel = await asyncio.to_thread(open_channel, mux, opened, on_output=on_output)
    except MuxBroken as broken:
        if broken.may_resend:  # nothing was sent: the service's own path runs it
            return None, token
        raise ConnectError("unavailable", f"the sandbox's exec helper broke: {broken}") from broken
    return channel, token


def _held(request: Request, entry: Entry, message: dict[str, Any]) -> Running:
    """The running command ``message`` names, with its stdin held open; else `ConnectError`."""
    selector = message.get("process")
    pid = selector.get("pid") if isinstance(selector, dict) else None
    if not isinstance(pid, int):
        raise ConnectError("invalid_argument", "process.pid is required")
    running = e2b_state(request).commands.find(entry.state.id, pid)
    if running is None:
        raise ConnectError("not_found", f"process with pid {pid} not found")
    if running.channel is None:
        raise ConnectError(
            "failed_precondition",
            f"process with pid {pid} has no open stdin: it was started without stdin=True,"
            " or in a sandbox without an exec helper to hold one",
        )
    return running


def _stdin_of(message: dict[str, Any], kind: str = "stdin") -> bytes:
    """The bytes of ``message``'s ``input.<kind>`` (``stdin``, or ``pty``: keys typed)."""
    value = message.get("input")
    data = value.get(kind, "") if isinstance(value, dict) else None
    if not isinstance(data, str):
        raise ConnectError("invalid_argument", f"input.{kind} (base64 bytes) is required")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ConnectError("invalid_argument", f"input.{kind} is not base64") from exc


def _input_to(request: Request, entry: Entry, start: dict[str, Any]) -> Callable[[dict[str, Any]], Awaitable[None]]:
    """Where a ``StreamInput``'s ``data`` messages go: typed into the terminal of the command
    ``start`` names (``input.pty``), else written to its held stdin (``input.stdin``)."""
    terminal = terminal_of(request, entry, start)
    if terminal is not None:
        typing = terminal

        async def typed(data: dict[str, Any]) -> None:
            try:
                await typing.asend(_stdin_of(data, "pty"))
            except MuxBroken as exc:
                raise ConnectError("unavailable", f"the sandbox's exec helper broke: {exc}") from exc

        return typed
    running = _held(request, entry, start)

    async def written(data: dict[str, Any]) -> None:
        await _write(running, _stdin_of(data))

    return written


async def _write(running: Running, data: bytes) -> None:
    """``data`` to the command's stdin; `ConnectError` once it is closed or the command ended."""
    channel = running.channel
    assert channel is not None  # `_held` checked it
    if channel.done:
        raise ConnectError("not_found", f"process with pid {running.pid} has ended")
    try:
        await asyncio.to_thread(channel.write, data)
    except ValueError as exc:
        raise ConnectError("failed_precondition", f"the stdin of process {running.pid} is closed") from exc
    except MuxBroken as exc:
        raise ConnectError("unavailable", f"the sandbox's exec helper broke: {exc}") from exc


def _failed(exc: ConnectError) -> Response:
    return JSONResponse({"code": exc.code, "message": exc.message}, HTTP_STATUS.get(exc.code, 400))


@router.post("/process.Process/SendInput")
async def send_input(request: Request) -> Response:
    """One chunk of bytes for a running command's stdin, or typed into its terminal
    (``input.pty``: `sandboxes.server.e2b.pty.send_pty_input`)."""
    entry = await access(request)
    try:
        message = await unary_message(request)
        value = message.get("input")
        if isinstance(value, dict) and "pty" in value:
            return await send_pty_input(request, entry, message)
        await _write(_held(request, entry, message), _stdin_of(message))
    except ConnectError as exc:
        return _failed(exc)
    return JSONResponse({})


@router.post("/process.Process/CloseStdin")
async def close_stdin(request: Request) -> Response:
    """The end of a running command's stdin (again: nothing more)."""
    entry = await access(request)
    try:
        channel = _held(request, entry, await unary_message(request)).channel
        assert channel is not None  # `_held` checked it
        await asyncio.to_thread(channel.close_stdin)
    except ConnectError as exc:
        return _failed(exc)
    except MuxBroken as exc:
        return _failed(ConnectError("unavailable", f"the sandbox's exec helper broke: {exc}"))
    return JSONResponse({})


@router.post("/process.Process/StreamInput")
async def stream_input(request: Request) -> Response:
    """A client stream: a ``start`` message naming the command, then ``data`` messages, each
    written to its stdin (or typed into its terminal) as it arrives; answered once the stream
    ends (the stdin stays open)."""
    entry = await access(request)
    try:
        send: Callable[[dict[str, Any]], Awaitable[None]] | None = None
        async for message in _messages(request.stream()):
            start, data = message.get("start"), message.get("data")
            if send is None:
                if not isinstance(start, dict):
                    raise ConnectError("invalid_argument", "the stream's first message must be a start event")
                send = _input_to(request, entry, start)
            elif isinstance(data, dict):
                await send(data)
            elif "keepalive" not in message:
                raise ConnectError("invalid_argument", "a stream input message is a data or keepalive event")
        if send is None:
            raise ConnectError("invalid_argument", "the stream named no process")
        answer = envelope({}) + end_of_stream()
    except ConnectError as exc:
        answer = end_of_stream(exc)
    return StreamingResponse(_once(answer), media_type=STREAM_MEDIA_TYPE)


async def _messages(chunks: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any]]:
    """The envelopes of a client stream's body, each parsed as it completes; bounded by
    `MAX_INPUT_MESSAGE` each, and a body that ends inside one is ``invalid_argument``."""
    buffer = bytearray()
    async for chunk in chunks:
        buffer += chunk
        while len(buffer) >= _HEADER.size:
            flags, length = _HEADER.unpack_from(buffer)
            if length > MAX_INPUT_MESSAGE:
                raise ConnectError("resource_exhausted", f"a stream input message is larger than {MAX_INPUT_MESSAGE}")
            if len(buffer) < _HEADER.size + length:
                break
            body = bytes(buffer[_HEADER.size : _HEADER.size + length])
            del buffer[: _HEADER.size + length]
            yield parse_message(flags, body)
    if buffer:
        raise ConnectError("invalid_argument", "the request ended inside a message")


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data
