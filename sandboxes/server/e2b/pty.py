"""envd's terminals: ``process.Process/Start`` with a ``pty`` (its ``size``) runs the command on a
pseudo-terminal in the sandbox (`sandboxes.terminal`, through its exec helper), whose bytes go
out as ``data`` events' ``pty`` field; ``SendInput`` with ``input.pty`` types into it,
``Update`` with ``pty.size`` resizes it; ``SendSignal`` kills it as any command (its tree, by
its marker), and ``Connect`` by pid reattaches to it (`sandboxes.server.e2b.process`)."""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from sandboxes.server.e2b.common import ENVD_PREFIX, E2BRoute, e2b_state, service
from sandboxes.server.e2b.connect import STREAM_MEDIA_TYPE, ConnectError, unary_message_or_empty
from sandboxes.server.e2b.envd import access
from sandboxes.server.e2b.running import Event, Running, outcome
from sandboxes.server.logs import unique_id
from sandboxes.server.processes import Command
from sandboxes.server.registry import Entry
from sandboxes.terminal import MAX_SIDE, Terminal, TerminalError, aopen_terminal

__all__ = ["MAX_QUEUED", "FellBehind", "PtyRunning", "router", "send_pty_input", "start_pty", "terminal_of"]

router = APIRouter(prefix=ENVD_PREFIX, route_class=E2BRoute, include_in_schema=False)

_STATUS = {
    "invalid_argument": 400,
    "failed_precondition": 400,
    "not_found": 404,
    "unimplemented": 501,
    "unavailable": 503,
}
"""The HTTP status of a unary call failing with a Connect code (Connect's own mapping)."""

EventStream = Callable[[Running, "asyncio.Queue[Event]"], AsyncIterator[bytes]]
"""How a command's events go out on one connection (`sandboxes.server.e2b.process._stream`)."""


MAX_QUEUED = 256
"""Chunks of a terminal's output queued for one connection at most (a chunk is one read of the
terminal, at most 64 KiB): a connection that reads slower than its terminal writes is ended
past it (`FellBehind`), and may reattach by pid."""


class FellBehind(Exception):
    """A connection's queue of a terminal's output outgrew `MAX_QUEUED`."""


@dataclass
class PtyRunning(Running):
    """A command started on a terminal: its events' ``data`` are ``pty`` bytes, queued for each
    connection up to `MAX_QUEUED` chunks (a terminal has no output budget: it may run for hours)."""

    terminal: Terminal | None = None

    def publish(self, event: Event) -> None:
        for listener in list(self.listeners):
            if isinstance(event, tuple) and listener.qsize() >= MAX_QUEUED:
                self.listeners.discard(listener)
                listener.put_nowait(FellBehind(f"more than {MAX_QUEUED} chunks of output unread"))
                continue
            listener.put_nowait(event)


def _size(value: object) -> tuple[int, int]:
    """(cols, rows) of a ``PTY`` message; `ConnectError` for anything else."""
    size = value.get("size") if isinstance(value, dict) else None
    cols = size.get("cols") if isinstance(size, dict) else None
    rows = size.get("rows") if isinstance(size, dict) else None
    if not (_side(cols) and _side(rows)):
        raise ConnectError("invalid_argument", f"pty.size.cols and rows are integers from 1 to {MAX_SIDE}")
    return int(cols), int(rows)  # type: ignore[arg-type]  # checked by `_side`


def _side(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and 1 <= value <= MAX_SIDE


async def start_pty(
    request: Request, entry: Entry, command: Command, message: dict[str, Any], stream: EventStream
) -> Response:
    """``Start`` with a ``pty``: ``command`` on a terminal of the message's size, holding one of
    the tenant's command slots until it ends; its events go out through ``stream``."""
    cols, rows = _size(message.get("pty"))
    from sandboxes.server.backends import MARKER_ENV

    svc = service(request)
    release = await svc.take_command_slot(entry)
    loop = asyncio.get_running_loop()
    early: list[bytes] = []
    holder: list[Running] = []

    def publish(chunk: bytes) -> None:  # on the loop
        if holder:
            holder[0].publish(("stdout", chunk))
        else:
            early.append(chunk)

    def on_data(chunk: bytes) -> None:  # on the exec helper's reader thread
        loop.call_soon_threadsafe(publish, chunk)

    token = unique_id()
    try:
        terminal = await aopen_terminal(
            entry.sandbox,
            on_data,
            cols=cols,
            rows=rows,
            command=command.command,
            env={**command.env, MARKER_ENV: token},
            cwd=command.cwd,
            timeout=command.timeout,
        )
    except TerminalError as exc:
        release()
        raise ConnectError("unavailable", exc.message) from exc
    except BaseException:
        release()
        raise
    work = asyncio.ensure_future(terminal.wait_async())
    work.add_done_callback(lambda _: release())
    pid = e2b_state(request).commands.next_pid()
    running = PtyRunning(pid, token, message["process"], work, terminal=terminal)
    events = running.listen()
    holder.append(running)
    for chunk in early:
        running.publish(("stdout", chunk))
    work.add_done_callback(lambda done: running.publish(outcome(done)))
    e2b_state(request).commands.add(entry.state.id, running)
    return StreamingResponse(stream(running, events), media_type=STREAM_MEDIA_TYPE)


def terminal_of(request: Request, entry: Entry, message: dict[str, Any]) -> Terminal | None:
    """The terminal of the command ``message``'s ``process`` names, ``None`` if that command
    runs on none (or is not found: the caller says so)."""
    selector = message.get("process")
    pid = selector.get("pid") if isinstance(selector, dict) else None
    running = e2b_state(request).commands.find(entry.state.id, pid) if isinstance(pid, int) else None
    return running.terminal if isinstance(running, PtyRunning) else None


def _terminal_of(request: Request, entry: Entry, message: dict[str, Any]) -> Terminal:
    selector = message.get("process")
    pid = selector.get("pid") if isinstance(selector, dict) else None
    if not isinstance(pid, int):
        raise ConnectError("invalid_argument", "process.pid is required")
    running = e2b_state(request).commands.find(entry.state.id, pid)
    if running is None:
        raise ConnectError("not_found", f"process with pid {pid} not found")
    if not isinstance(running, PtyRunning) or running.terminal is None:
        raise ConnectError("failed_precondition", f"process with pid {pid} was not started with a pty")
    return running.terminal


async def send_pty_input(request: Request, entry: Entry, message: dict[str, Any]) -> Response:
    """``SendInput`` with ``input.pty``: the bytes typed into the terminal."""
    try:
        value = message.get("input")
        data = value.get("pty") if isinstance(value, dict) else None
        if not isinstance(data, str):
            raise ConnectError("invalid_argument", "input.pty (base64 bytes) is required")
        try:
            typed = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ConnectError("invalid_argument", "input.pty is not base64") from exc
        await _terminal_of(request, entry, message).asend(typed)
    except ConnectError as exc:
        return _failed(exc)
    return JSONResponse({})


@router.post("/process.Process/Update")
async def update(request: Request) -> Response:
    """``Update`` with ``pty.size``: the terminal's new size (its programs get SIGWINCH)."""
    entry = await access(request)
    message = await unary_message_or_empty(request)
    try:
        terminal = _terminal_of(request, entry, message)
        if message.get("pty") is not None:
            await terminal.aresize(*_size(message["pty"]))
    except ConnectError as exc:
        return _failed(exc)
    return JSONResponse({})


def _failed(exc: ConnectError) -> Response:
    return JSONResponse({"code": exc.code, "message": exc.message}, _STATUS.get(exc.code, 400))
