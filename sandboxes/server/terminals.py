"""Terminals through the service: ``GET /v1/sandboxes/{id}/pty`` upgraded to a WebSocket, a
command (a login shell by default) on a pseudo-terminal in the sandbox (`sandboxes.terminal`).

On the socket, binary messages are the terminal's bytes both ways; text messages are JSON:
from the client `api.PtyControl` (resize, kill), from the service `api.PtyMessage` (first the
session's id, last the command's exit, after which the service closes the socket).

Each terminal is a session with an id (`TerminalSession`), held by the service apart from the
socket: a client that lost its socket reattaches with ``?session=<id>`` (one socket at a time;
a new one takes over) and gets the last `SCROLLBACK` bytes, then the live ones. A session
nobody is attached to for the grace (`Terminals.grace`) is killed; an ended one is kept as long,
for its exit. A terminal takes one of its tenant's command slots until it ends. What is queued
for a socket that does not read is bounded (`BACKLOG`): past it, the socket is closed, and the
client may reattach.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from typing import Protocol

import pydantic
from starlette.websockets import WebSocket, WebSocketDisconnect

from sandboxes import api
from sandboxes.server.auth import Authenticator, RateLimiter, websocket_tenant
from sandboxes.server.errors import ServiceError
from sandboxes.server.metrics import Metrics
from sandboxes.server.registry import Entry, Registry
from sandboxes.server.responses import service_error
from sandboxes.server.settings import ServiceSettings
from sandboxes.terminal import Terminal, TerminalError, aopen_terminal

__all__ = ["BACKLOG", "REATTACH_GRACE", "SCROLLBACK", "TerminalSession", "Terminals", "serve_pty"]

SCROLLBACK = 64 << 10
"""Bytes of a terminal's latest output a reattaching client gets first."""
REATTACH_GRACE = 60.0
"""Seconds a session waits for a client to (re)attach before it is killed (`Terminals.grace`)."""
BACKLOG = 1 << 20
"""Bytes queued for one socket at most: a client that reads slower than its terminal writes is
closed past it (and may reattach)."""
_DROPPED = 4000 + 1013
"""The close code of a socket dropped for its backlog (1013, "try again later", as an
application's code)."""

Item = bytes | api.PtyExit | None
"""What goes out on a socket: terminal bytes, the exit, or ``None``: close it now."""


class _Attachment:
    """One socket attached to a session: what is queued for it, bounded by `BACKLOG`."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self.queued = 0
        self.closed = False

    def push(self, item: Item) -> None:
        if self.closed:
            return
        if isinstance(item, bytes):
            self.queued += len(item)
            if self.queued > BACKLOG:
                self.close()
                return
        self.queue.put_nowait(item)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(None)


class TerminalSession:
    """One terminal: its output kept (`SCROLLBACK`) and handed to the socket attached, if any;
    killed once nobody was attached for the grace. Its methods run on the service's event
    loop, but `on_data` and `on_end`, which the exec helper's reader thread calls."""

    def __init__(self, tenant: str, sandbox_id: str, terminals: Terminals, release: Callable[[], None]) -> None:
        self.ident = secrets.token_urlsafe(16)
        self.tenant = tenant
        self.sandbox_id = sandbox_id
        self.terminal: Terminal | None = None
        self.exit: api.PtyExit | None = None
        self._terminals = terminals
        self._release = release
        self._loop = asyncio.get_running_loop()
        self._scrollback = bytearray()
        self._attached: _Attachment | None = None
        self._timer: asyncio.TimerHandle | None = None

    def on_data(self, chunk: bytes) -> None:
        """The terminal's output (the reader's thread)."""
        with contextlib.suppress(RuntimeError):  # the loop closed: the service is stopping
            self._loop.call_soon_threadsafe(self._data, chunk)

    def on_end(self) -> None:
        """The terminal's command ended (the reader's thread, after its last output)."""
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._ended)

    def _data(self, chunk: bytes) -> None:
        self._scrollback += chunk
        excess = len(self._scrollback) - SCROLLBACK
        if excess > 0:
            del self._scrollback[:excess]
        if self._attached is not None:
            self._attached.push(chunk)

    def _ended(self) -> None:
        assert self.terminal is not None  # `on_end` is registered once it is known
        answer = self.terminal.wait(0)
        if answer is None:  # cannot happen: it ended
            return
        self.exit = api.PtyExit(exit_code=answer.exit_code, error=answer.error, message=answer.message)
        self._release()
        self._rearm(self._terminals.forget if self._attached is None else None)
        if self._attached is not None:
            self._attached.push(self.exit)
            self._terminals.forget(self)

    def attach(self) -> _Attachment:
        """A socket attaches (one at a time: an earlier one is closed): it gets the scrollback,
        then what comes, and the exit once there is one."""
        if self._attached is not None:
            self._attached.close()
        self._rearm(None)
        attachment = self._attached = _Attachment()
        if self._scrollback:
            attachment.push(bytes(self._scrollback))
        if self.exit is not None:
            attachment.push(self.exit)
            self._terminals.forget(self)
        return attachment

    def detach(self, attachment: _Attachment) -> None:
        """``attachment``'s socket is gone: the grace starts, unless another took over."""
        if self._attached is not attachment:
            return
        self._attached = None
        self._rearm(self._expire if self.exit is None else self._terminals.forget)

    def _rearm(self, then: Callable[[TerminalSession], None] | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None if then is None else self._loop.call_later(self._terminals.grace, then, self)

    def _expire(self, _self: TerminalSession) -> None:
        if self._attached is None and self.exit is None and self.terminal is not None:
            self._loop.run_in_executor(None, self.terminal.kill)

    async def control(self, text: str) -> None:
        """A text message from the socket: `api.PtyControl`; ``invalid_request`` if it is not."""
        assert self.terminal is not None
        try:
            control = api.PtyControl.model_validate_json(text)
        except pydantic.ValidationError as exc:
            raise ServiceError("invalid_request", f"a terminal's control message is not one: {exc}") from exc
        if control.resize is not None:
            await self.terminal.aresize(control.resize.cols, control.resize.rows)
        if control.kill:
            await self.terminal.akill()


class Terminals:
    """The service's terminal sessions, by id, each its tenant's."""

    def __init__(self, grace: float = REATTACH_GRACE) -> None:
        self.grace = grace
        self._sessions: dict[str, TerminalSession] = {}

    def forget(self, session: TerminalSession) -> None:
        self._sessions.pop(session.ident, None)

    def find(self, tenant: str, sandbox_id: str, ident: str) -> TerminalSession:
        """The tenant's session ``ident`` in that sandbox; ``not_found`` otherwise (another
        tenant's too)."""
        session = self._sessions.get(ident)
        if session is None or session.tenant != tenant or session.sandbox_id != sandbox_id:
            raise ServiceError("not_found", f"no terminal session {ident!r} in sandbox {sandbox_id!r}")
        return session

    async def open(
        self,
        entry: Entry,
        release: Callable[[], None],
        size: api.PtySize,
        command: str | None,
        timeout: float,  # noqa: ASYNC109 - the command's own, enforced by the helper
    ) -> TerminalSession:
        """A new session on ``entry``'s sandbox, holding the command slot ``release`` gives back."""
        session = TerminalSession(entry.state.tenant, entry.state.id, self, release)
        try:
            session.terminal = await aopen_terminal(
                entry.sandbox, session.on_data, cols=size.cols, rows=size.rows, command=command, timeout=timeout
            )
        except TerminalError as exc:
            release()
            raise ServiceError("backend_unavailable", exc.message) from exc
        except BaseException:
            release()
            raise
        self._sessions[session.ident] = session
        session.terminal.on_end(session.on_end)
        return session


class _Service(Protocol):
    """What `serve_pty` needs of `sandboxes.server.routes.Service`."""

    settings: ServiceSettings
    registry: Registry
    auth: Authenticator
    limiter: RateLimiter
    metrics: Metrics
    terminals: Terminals

    def take_command_slot(self, entry: Entry) -> Awaitable[Callable[[], None]]: ...


async def serve_pty(svc: _Service, websocket: WebSocket, sandbox_id: str) -> None:
    """``GET /v1/sandboxes/{id}/pty?cols=&rows=[&command=][&session=]``: authenticate (header,
    or a ``bearer.<key>`` subprotocol), find the sandbox, open a session (or find the one
    ``session`` names, to reattach), then relay until the socket or the command ends. A refusal
    is an HTTP error answer (where the server can send one), else a close with 1008 and the
    reason."""
    query = websocket.query_params
    command, session_id = query.get("command"), query.get("session")
    try:
        tenant = websocket_tenant(svc.auth, websocket.scope)
        svc.limiter.check(tenant)
        wanted = _size(query.get("cols"), query.get("rows"))
        entry = await svc.registry.find(tenant, sandbox_id)
        if session_id is not None:
            session = svc.terminals.find(tenant.id, sandbox_id, session_id)
        else:
            release = await svc.take_command_slot(entry)
            session = await svc.terminals.open(entry, release, wanted, command, svc.settings.max_execute_timeout)
    except ServiceError as exc:
        await _deny(svc, websocket, exc)
        return
    offered = api.PTY_SUBPROTOCOL in websocket.scope.get("subprotocols", ())
    await websocket.accept(subprotocol=api.PTY_SUBPROTOCOL if offered else None)
    await _relay(websocket, session)


def _size(cols: str | None, rows: str | None) -> api.PtySize:
    """The query's size (80 x 24 where it says none); ``invalid_request`` for one out of bounds."""
    try:
        return api.PtySize(cols=int(cols or 80), rows=int(rows or 24))
    except ValueError as exc:  # pydantic's too
        raise ServiceError(
            "invalid_request", f"a terminal's cols and rows are integers from 1 to 10000, not {cols!r} x {rows!r}"
        ) from exc


async def _deny(svc: _Service, websocket: WebSocket, exc: ServiceError) -> None:
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(service_error(svc.metrics, exc))
    else:
        svc.metrics.errors.labels(exc.code).inc()
        await websocket.close(1008, f"{exc.code}: {exc.message}"[:120])


async def _relay(websocket: WebSocket, session: TerminalSession) -> None:
    attachment = session.attach()
    try:
        await websocket.send_text(api.PtyMessage(session=session.ident).model_dump_json(exclude_none=True))
        sending = asyncio.create_task(_send_out(websocket, attachment))
        taking = asyncio.create_task(_take_in(websocket, session))
        try:
            await asyncio.wait({sending, taking}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sending, taking):
                task.cancel()
            await asyncio.gather(sending, taking, return_exceptions=True)
    except (WebSocketDisconnect, RuntimeError, OSError):  # the socket is gone
        pass
    finally:
        session.detach(attachment)


async def _send_out(websocket: WebSocket, attachment: _Attachment) -> None:
    while True:
        item = await attachment.queue.get()
        if item is None:
            await websocket.close(_DROPPED, "replaced, or too far behind: reattach")
            return
        if isinstance(item, bytes):
            await websocket.send_bytes(item)
            continue
        await websocket.send_text(api.PtyMessage(exit=item).model_dump_json(exclude_none=True))
        await websocket.close(1000)
        return


async def _take_in(websocket: WebSocket, session: TerminalSession) -> None:
    assert session.terminal is not None
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        data, text = message.get("bytes"), message.get("text")
        if data:
            await session.terminal.asend(data)
        elif text is not None:
            try:
                await session.control(text)
            except ServiceError as exc:
                await websocket.send_text(
                    api.ErrorBody(error=exc.code, message=exc.message).model_dump_json(exclude_none=True)
                )
