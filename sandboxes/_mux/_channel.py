"""A command held open both ways through the exec helper (`open_channel`): what a terminal, a
process fed stdin as it goes, a file watch or a relayed connection is built on, once, for every
backend whose sandbox holds a helper (`sandboxes._capabilities.HoldsHelper`).

A channel is a command like any other on the helper's stream (its R frame, its stdin as I
frames and their end as C, K to kill it, its output as O and S, its end as X or E), except that
its stdin stays open until the caller closes it, its output goes to the caller as it arrives,
and its end is awaited separately. A capability that needs more of the helper (a terminal's
size, say) adds fields to the request (``spec``) and frame kinds of its own (`Channel.send`),
declared in `sandboxes._helper.frames`.

Once opened, a channel may have run: it is never sent again, and a stream that breaks under it
ends it with `MuxBroken`, as for `MuxClient.run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Mapping

from sandboxes import protocol as p
from sandboxes._helper.frames import CLOSE_STDIN, KILL, STDIN
from sandboxes._mux._command import Command
from sandboxes._mux._frames import _STDIN_CHUNK, _Pending, _request_frame, _response
from sandboxes._mux._stream import MuxBroken
from sandboxes._mux.client import KILL_GRACE, MuxClient
from sandboxes._output import OutputHook

__all__ = ["Channel", "open_channel"]


class _EndEvent(threading.Event):
    """A channel's ``done``: also runs the callbacks waiting for its end (on the thread that set
    it: the reader's, which they must not block)."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def set(self) -> None:
        with self._lock:
            super().set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_set(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once set (now, if it already is)."""
        with self._lock:
            if not self.is_set():
                self._callbacks.append(callback)
                return
        callback()


class Channel:
    """One command held open on a helper's stream: stdin written as the caller goes, output
    handed over as it arrives, its end awaited apart. From any thread; `wait_async` from a loop.
    The helper enforces the command's own timeout; `kill` ends it before that."""

    def __init__(self, client: MuxClient, ident: int, pending: _Pending, timeout: float | None) -> None:
        self._client = client
        self.ident = ident
        self._pending = pending
        self._end: _EndEvent = pending.done  # type: ignore[assignment]  # made so by `open_channel`
        self._timeout = timeout
        self._opened = time.monotonic()
        self._stdin_closed = False

    @property
    def done(self) -> bool:
        """Whether the command ended (or its stream broke)."""
        return self._pending.done.is_set()

    @property
    def error(self) -> str | None:
        """Why the channel ended without an answer of its own: its stream broke, or the helper
        could not run it (its reason); ``None`` otherwise (still running, or answered)."""
        return self._pending.failure or self._pending.start_error

    def write(self, data: bytes) -> None:
        """Bytes for the command's stdin, in frames the helper writes as the command reads them;
        `MuxBroken` if the stream broke, ValueError once stdin was closed."""
        if self._stdin_closed:
            raise ValueError("the channel's stdin is closed")
        view = memoryview(data)
        for offset in range(0, len(view), _STDIN_CHUNK):
            self._client._send(STDIN, self.ident, bytes(view[offset : offset + _STDIN_CHUNK]))

    def close_stdin(self) -> None:
        """The end of the command's stdin (once; later calls do nothing)."""
        if not self._stdin_closed:
            self._stdin_closed = True
            if not self.done:
                self._client._send(CLOSE_STDIN, self.ident)

    def send(self, kind: bytes, payload: bytes | memoryview = b"") -> None:
        """A frame of a capability's own kind for this command (see `sandboxes._helper.frames`)."""
        self._client._send(kind, self.ident, payload)

    def kill(self) -> None:
        """Kill the command's whole tree (as its timeout would); nothing once it ended or its
        stream broke."""
        if not self.done:
            with contextlib.suppress(MuxBroken):
                self._client._send(KILL, self.ident)

    def on_end(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the channel ended (at once if it has), on the reader's thread:
        it must neither block nor raise."""
        self._end.on_set(callback)

    def wait(self, timeout: float | None = None) -> p.ExecuteResponse | None:
        """The command's answer once it ended within ``timeout`` seconds (``None``: however long
        it runs), else ``None``. `MuxBroken` if the stream broke under it, or the helper did not
        acknowledge it or report its end within its timeout and a grace."""
        until = None if timeout is None else time.monotonic() + timeout
        while not self.done:
            now = time.monotonic()
            overdue, check = self._client.deadline(self.ident, self._pending, self._opened, self._timeout, now)
            if overdue:
                self._client.send_kill(self.ident)
                if not self._pending.done.wait(KILL_GRACE):
                    self._client.unreported(self.ident)
                break
            if until is not None and now >= until:
                return None
            limits = [limit for limit in (check, until) if limit is not None]
            self._pending.done.wait(max(0.0, min(limits) - now) if limits else None)
        self._client.forget(self.ident)
        return _response(self._pending, self._timeout, self._opened)

    async def wait_async(self) -> p.ExecuteResponse:
        """`wait` on an event loop: no thread waits for the end (the reader's wakes the loop)."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not ended.done():
                ended.set_result(None)

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle)

        while True:
            self.on_end(wake)
            now = time.monotonic()
            overdue, check = self._client.deadline(self.ident, self._pending, self._opened, self._timeout, now)
            if self.done or overdue:
                break
            timer = None if check is None else loop.call_later(max(0.0, check - now), settle)
            try:
                await ended
            finally:
                if timer is not None:
                    timer.cancel()
            if self.done:
                break
            ended = loop.create_future()
        if not self.done:
            await asyncio.to_thread(self.wait)
        self._client.forget(self.ident)
        return _response(self._pending, self._timeout, self._opened)


def open_channel(
    client: MuxClient,
    command: Command,
    *,
    on_output: OutputHook | None = None,
    spec: Mapping[str, object] | None = None,
    on_frame: Callable[[bytes, bytes], None] | None = None,
) -> Channel:
    """Start ``command`` with its stdin open (written by `Channel.write`: a ``command.stdin``
    is ValueError); its output goes to ``on_output`` as it arrives (on the reader's thread: it
    must neither block nor raise), and the last ``command.output_limit`` bytes of it, head and
    tail, make its answer. ``spec``: fields a capability adds to the request; ``on_frame``: its
    own kinds of frames (kind, payload), as ``on_output`` is called. `MuxBroken` if it could not
    be sent (``may_resend``: nothing was written)."""
    if command.stdin is not None:
        raise ValueError("a channel's stdin is written as it goes (Channel.write), not given with its command")
    ident, pending = client.register(_Pending.of(command, on_output, done=_EndEvent(), on_frame=on_frame))
    frame = _request_frame(ident, command, stdin_open=True, extra=spec)
    try:
        client._send_frame(frame)
    except MuxBroken as broken:
        client.forget(ident)
        raise MuxBroken(str(broken), may_resend=True) from broken
    client._want_reader()
    return Channel(client, ident, pending, command.timeout)
