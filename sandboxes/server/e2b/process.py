"""envd's ``process.Process/Start`` and ``Connect`` over Connect (JSON codec, server streaming): the command
runs as E2B runs it (``/bin/bash -l -c CMD``, with its cwd and envs) through the sandbox's
streamed execute, and its events go out as they happen: ``start`` (a pid), ``data`` (stdout
and stderr apart, base64), keep-alives while it is quiet, then ``end`` (exit code, status).
A command's output past the service's ``max_output_bytes`` is not sent; its deadline is the
call's ``Connect-Timeout-Ms`` (none, as the SDK's ``timeout=0`` sends: the service's maximum),
capped by the service's maximum, and past it the command's tree is killed. ``Connect`` by pid
reattaches to a running command: its events from then on, on as many connections as ask."""

from __future__ import annotations

import asyncio
import base64
import shlex
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from sandboxes import api
from sandboxes import protocol as p
from sandboxes._output import Stream
from sandboxes.server.e2b.common import ENVD_PREFIX, E2BRoute, e2b_state, service
from sandboxes.server.e2b.connect import (
    STREAM_MEDIA_TYPE,
    ConnectError,
    end_of_stream,
    envelope,
    read_envelope,
    unary_message_or_empty,
)
from sandboxes.server.e2b.envd import access
from sandboxes.server.e2b.pty import PtyRunning, start_pty
from sandboxes.server.e2b.running import Event, Running, outcome
from sandboxes.server.e2b.stdin import open_with_stdin
from sandboxes.server.e2b.stream import EventStream
from sandboxes.server.errors import ServiceError
from sandboxes.server.execution import command_for, run_detached
from sandboxes.server.processes import Command
from sandboxes.server.registry import Entry
from sandboxes.server.routes import Service

__all__ = ["router"]

router = APIRouter(prefix=ENVD_PREFIX, route_class=E2BRoute, include_in_schema=False)

KEEPALIVE_CEILING = 50.0
"""The longest quiet (seconds) between two events, whatever ``Keepalive-Ping-Interval`` asks."""

KILL_ATTEMPTS = 10
KILL_WAIT = 0.5
"""A kill is repeated (``KILL_ATTEMPTS`` times at most) until the command has ended, waiting
this long for it each time: the ``start`` event goes out as the command is handed to the
sandbox, so a kill right after it may come before its processes exist."""


@router.post("/process.Process/Start")
async def start(request: Request) -> Response:
    entry = await access(request)
    svc = service(request)
    try:
        message = read_envelope(await request.body())
        command = _command(svc, entry, message, request.headers.get("connect-timeout-ms"))
        if message.get("pty") is not None:
            interval = _keepalive(request.headers.get("keepalive-ping-interval"))
            return await start_pty(request, entry, command, message, lambda run, events: _stream(run, events, interval))
    except ConnectError as exc:
        return StreamingResponse(_once(end_of_stream(exc)), media_type=STREAM_MEDIA_TYPE)
    release = await svc.take_command_slot(entry)
    loop = asyncio.get_running_loop()
    budget = [svc.settings.max_output_bytes]
    pid = e2b_state(request).commands.next_pid()

    def publish(event: Event) -> None:  # on the loop, after `running` is bound below
        running.publish(event)

    def on_output(data: bytes, stream: Stream = "merged") -> None:  # on a transport thread
        kept = data[: max(0, budget[0])]
        budget[0] -= len(data)
        if kept:
            loop.call_soon_threadsafe(publish, (stream, kept))

    try:
        held = await open_with_stdin(entry, command, on_output, release) if message.get("stdin") is True else None
    except ConnectError as exc:  # the slot was released
        return StreamingResponse(_once(end_of_stream(exc)), media_type=STREAM_MEDIA_TYPE)
    if held is None:
        work, token = run_detached(entry.sandbox, command, on_output, svc.command_pool, release)
        channel = None
    else:
        work, token, channel = held
    running = Running(pid, token, message["process"], work, channel=channel)
    events = running.listen()
    work.add_done_callback(lambda done: running.publish(outcome(done)))
    e2b_state(request).commands.add(entry.state.id, running)
    interval = _keepalive(request.headers.get("keepalive-ping-interval"))
    return EventStream(_stream(running, events, interval))


@router.post("/process.Process/Connect")
async def connect(request: Request) -> Response:
    """A running command's events from now on (its output, then its end), to any number of
    connections at once; an unknown or ended pid ends the stream with ``not_found``."""
    entry = await access(request)
    try:
        message = read_envelope(await request.body())
    except ConnectError as exc:
        return StreamingResponse(_once(end_of_stream(exc)), media_type=STREAM_MEDIA_TYPE)
    selector = message.get("process")
    pid = selector.get("pid") if isinstance(selector, dict) else None
    running = e2b_state(request).commands.find(entry.state.id, pid) if isinstance(pid, int) else None
    if running is None:
        error = ConnectError("not_found", f"process with pid {pid} not found")
        return StreamingResponse(_once(end_of_stream(error)), media_type=STREAM_MEDIA_TYPE)
    interval = _keepalive(request.headers.get("keepalive-ping-interval"))
    return EventStream(_stream(running, running.listen(), interval))


@router.post("/process.Process/List")
async def list_processes(request: Request) -> Response:
    """The commands started through ``Start`` that still run in this sandbox."""
    entry = await access(request)
    running = e2b_state(request).commands.of(entry.state.id)
    return JSONResponse({"processes": [{"pid": command.pid, "config": command.config} for command in running]})


@router.post("/process.Process/SendSignal")
async def send_signal(request: Request) -> Response:
    """SIGKILL and SIGTERM both kill the command's whole tree; an unknown pid is NOT_FOUND."""
    entry = await access(request)
    message = await unary_message_or_empty(request)
    selector = message.get("process")
    pid = selector.get("pid") if isinstance(selector, dict) else None
    if not isinstance(pid, int):
        return _unary_error(400, "invalid_argument", "process.pid is required")
    running = e2b_state(request).commands.find(entry.state.id, pid)
    if running is None:
        return _unary_error(404, "not_found", f"process with pid {pid} not found")
    for _ in range(KILL_ATTEMPTS):
        await asyncio.to_thread(entry.kill_marked, running.token)
        await asyncio.wait([running.work], timeout=KILL_WAIT)
        if running.work.done():
            return JSONResponse({})
    return _unary_error(503, "unavailable", f"process with pid {pid} did not die")


def _unary_error(status: int, code: str, message: str) -> Response:
    return JSONResponse({"code": code, "message": message}, status)


def _command(svc: Service, entry: Entry, message: dict[str, Any], deadline_ms: str | None) -> Command:
    process = message.get("process")
    if not isinstance(process, dict) or not isinstance(process.get("cmd"), str):
        raise ConnectError("invalid_argument", "process.cmd is required")
    args = process.get("args") or []
    envs = process.get("envs") or {}
    cwd = process.get("cwd") or None
    if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
        raise ConnectError("invalid_argument", "process.args must be strings")
    if not isinstance(envs, dict) or not all(isinstance(v, str) for v in envs.values()):
        raise ConnectError("invalid_argument", "process.envs must map names to strings")
    timeout = 0.0  # the service's maximum (`command_for`)
    if deadline_ms is not None and deadline_ms.isdigit():
        timeout = max(1.0, int(deadline_ms) / 1000)
    try:
        argv = shlex.join([process["cmd"], *args])  # exec'd, as envd starts it: no shell waits above it
        request = api.ExecuteRequest(command=f"exec {argv}", env=envs, cwd=cwd, timeout=timeout)
        return command_for(request, entry.backend.template, svc.settings)
    except ServiceError as exc:
        raise ConnectError("invalid_argument", exc.message) from exc
    except ValueError as exc:  # pydantic's, on a name or value the service refuses
        raise ConnectError("invalid_argument", str(exc).splitlines()[0]) from exc


def _keepalive(header: str | None) -> float:
    if header is not None and header.isdigit() and int(header) > 0:
        return min(float(header), KEEPALIVE_CEILING)
    return KEEPALIVE_CEILING


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _stream(running: Running, events: asyncio.Queue[Event], interval: float) -> AsyncIterator[bytes]:
    """The command's events on one connection, which stops listening when it ends or leaves."""
    try:
        yield envelope({"event": {"start": {"pid": running.pid}}})
        while True:
            try:
                event = await asyncio.wait_for(events.get(), interval)
            except TimeoutError:
                yield envelope({"event": {"keepalive": {}}})
                continue
            if isinstance(event, tuple):
                stream, data = event
                name = "pty" if isinstance(running, PtyRunning) else "stderr" if stream == "stderr" else "stdout"
                yield envelope({"event": {"data": {name: base64.b64encode(data).decode("ascii")}}})
                continue
            yield _ending(event)
            return
    finally:
        running.listeners.discard(events)


def _ending(event: p.ExecuteResponse | BaseException) -> bytes:
    if isinstance(event, BaseException):
        return end_of_stream(ConnectError("unavailable", f"the sandbox's backend failed: {type(event).__name__}"))
    if event.exit_code is None:
        code = "deadline_exceeded" if event.error == p.TIMEOUT else "unavailable"
        return end_of_stream(ConnectError(code, event.message or event.error or "the command did not finish"))
    ended = {"exitCode": event.exit_code, "exited": True, "status": f"exit status {event.exit_code}"}
    return envelope({"event": {"end": ended}}) + end_of_stream()


@router.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "DELETE"])
async def not_served(request: Request, rest: str) -> Response:
    """envd calls not served yet, as Connect's ``unimplemented`` (to the sandbox's token holder)."""
    await access(request)
    return JSONResponse({"code": "unimplemented", "message": f"/{rest} is not implemented by this service"}, 501)
