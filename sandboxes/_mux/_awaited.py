"""Commands awaited on an event loop (`arun`): a service would otherwise hold one thread per
running command. The same frames, timeouts and `MuxBroken` as `MuxClient.run`; the client's
reader thread reads for them (`MuxClient.serve_async`), and an answer wakes the loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable

from sandboxes import protocol as p
from sandboxes._mux import client as client_module
from sandboxes._mux._command import Command
from sandboxes._mux._frames import _Pending, _response, _send_stdin
from sandboxes._mux._outbox import Queued
from sandboxes._mux._stream import MuxBroken
from sandboxes._mux.client import MuxClient
from sandboxes._output import OutputHook

__all__ = ["arun"]

_SEND_INLINE = 64 << 10
"""Stdin up to this size is sent from the event loop; more from a worker thread."""


class _WakingEvent(threading.Event):
    """A command's ``done``, that also wakes an event loop when set (from the reader thread)."""

    def __init__(self, wake: Callable[[], None]) -> None:
        super().__init__()
        self._wake = wake

    def set(self) -> None:
        super().set()
        self._wake()


async def arun(client: MuxClient, command: Command, on_output: OutputHook | None = None) -> p.ExecuteResponse:
    """`MuxClient.run` for an event loop: the command is awaited, no thread waits on it (a
    service would otherwise hold one thread per running command). Same frames, same timeouts,
    same `MuxBroken`."""
    timeout, stdin = command.timeout, command.stdin
    client.serve_async()
    loop = asyncio.get_running_loop()
    ended: list[asyncio.Future[None]] = [loop.create_future()]
    """What the waiting coroutine awaits now: resolved by the command's end (or a timer), then
    replaced if it must wait on."""

    def settle() -> None:
        _resolve(ended[0])

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle)

    ident, pending = client.register(_Pending.of(command, on_output, done=_WakingEvent(wake)))
    started = time.monotonic()
    queued: Queued | None = None
    try:
        if stdin is None:  # the request goes out with the others of this turn of the loop
            queued = client.queue_request(loop, ident, command)
            if queued is None:
                raise MuxBroken(client.broken or "exec helper stream broken", may_resend=True)
        else:  # its stdin frames must follow it: written at once, in order
            client.request(ident, command)
            if len(stdin) <= _SEND_INLINE:
                _send_stdin(client, ident, stdin)
            else:
                await asyncio.to_thread(_send_stdin, client, ident, stdin)
        await _await_async(client, ident, pending, ended, time.monotonic(), timeout)
        return _response(pending, timeout, started)
    except MuxBroken as broken:
        if queued is not None and client.withdraw(queued):  # no whole request was written
            raise MuxBroken(str(broken), may_resend=True) from broken
        raise
    finally:
        if queued is not None:  # cancelled before its turn: never written, so it never runs
            client.withdraw(queued)
        client.forget(ident)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _woken(ended: list[asyncio.Future[None]], delay: float | None) -> None:
    """Until ``ended[0]`` is resolved (the command's end wakes it) or ``delay`` seconds passed.

    One timer handle, not `asyncio.wait` with a timeout, which builds a set, a waiter future,
    a timer and callbacks on every future it is given, for every command."""
    loop = asyncio.get_running_loop()
    if ended[0].done():  # resolved by an earlier timer: a fresh one for this wait
        ended[0] = loop.create_future()
    timer = None if delay is None else loop.call_later(delay, _resolve, ended[0])
    try:
        await ended[0]
    finally:
        if timer is not None:
            timer.cancel()


async def _await_async(
    client: MuxClient,
    ident: int,
    pending: _Pending,
    ended: list[asyncio.Future[None]],
    sent: float,
    timeout: float | None,  # noqa: ASYNC109 - the command's own, enforced by the helper
) -> None:
    """`MuxClient._await`, awaiting ``ended`` instead of blocking on ``pending.done`` (which is
    set before ``ended`` is resolved, from the reader thread)."""
    while not pending.done.is_set():
        now = time.monotonic()
        overdue, until = client.deadline(ident, pending, sent, timeout, now)
        if overdue:
            client.send_kill(ident)
            give_up = time.monotonic() + client_module.KILL_GRACE
            while not pending.done.is_set() and time.monotonic() < give_up:
                await _woken(ended, max(0.0, give_up - time.monotonic()))
            if not pending.done.is_set():
                client.unreported(ident)
            return
        await _woken(ended, None if until is None else max(0.0, until - now))
