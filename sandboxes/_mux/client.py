"""Client of the in-sandbox exec helper (`sandboxes._mux._server`), over any byte stream.

A transport (a ``docker exec`` attach socket, an SSH channel, a local pipe) only has to offer
`ByteStream`; the client multiplexes concurrent commands over it, applies the output cap, and
turns a dead stream into a clear error for every command in flight.

When may a command be sent again? Only when no whole request of it can ever reach a helper:
the client knew the stream was broken before writing, or the stream's ``send`` raised (then the
request frame is incomplete on the wire, the helper only acts on whole frames, and the client
writes nothing more on a stream after a failed send). Once the request is written, its fate is
unknown, acknowledged or not: the helper queues its acknowledgement BEFORE it starts a command
(it goes out with the command's first output or exit, or a few ms later), but a missing
acknowledgement proves nothing, since the request may still be in a pipe, a socket or a relay
(dockerd, sshd, the API server) and be read and started after the client gave up, and the
acknowledgement itself may be what was lost. Such a command answers ``connection_lost``, never
a second run. `MuxBroken.may_resend` carries this decision; every transport asks it and nothing
else.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sandboxes import protocol as p
from sandboxes._mux._outbox import Outbox, Queued
from sandboxes._output import OutputBuffer, execute_response

HEADER = struct.Struct(">cII")
MAX_FRAME = 1 << 20
"""The largest frame the client accepts from a helper. The helper's own frames are far smaller
(output goes out in chunks of at most 64 KiB); a bigger announced length is a corrupt or forged
stream (a command writing into the helper's stdout), which is dropped before a byte of it is
buffered: nothing a sandbox sends can make the client hold more than this plus one read."""
_KINDS = frozenset(b"HAOXEN")
_HERE = Path(__file__).parent
SERVER_SOURCE = "\n".join(
    path.read_text(encoding="utf-8")
    for path in (
        _HERE.parent / "_kill.py",
        _HERE / "_reap.py",
        _HERE / "_search.py",
        _HERE / "_listing.py",
        _HERE / "_files.py",
        _HERE / "_uploads.py",
        _HERE / "_server.py",
    )
)
"""Shipped as ``python3 -c SERVER_SOURCE``: nothing is installed in the sandbox. Seven files, one
script: the helper (`_server`), how it finds what commands left behind (`_reap`), its reads and
writes without a process (`_files`, `_uploads`), its searches (`_search`), its listings and
deletes (`_listing`), and the one process-tree kill every backend uses (`sandboxes._kill`)."""

_STDIN_CHUNK = 1 << 16
"""Stdin goes to the helper in frames of this size. Not bigger: the helper hands a frame to the
command only once all of it arrived, so small frames keep the client, the helper and the command
busy at the same time; and every chunk of 128 KiB or more is a fresh mmap and its page faults, on
both sides. Measured over pipes (64 MiB into ``cat``): 1 MiB frames 340-450 MiB/s, 64 KiB frames
500-900 MiB/s, with a quarter of the client's CPU."""
_RECV_SIZE = 1 << 16
_QUOTED_GARBAGE = 300  # bytes of a non-helper's first words quoted in the error
_KILL_GRACE = 10.0
"""Seconds past a command's timeout before the client stops trusting the helper to report it."""
_KILL_MARKED_WAIT = 30.0
"""Seconds to wait for the helper's answer to a kill by marker (two phases of at most 10 s)."""

ACK_TIMEOUT = 15.0
"""Seconds to wait for the helper to acknowledge a command before the stream is declared broken:
a hung helper or stream becomes an error instead of a hang. The command's fate is unknown (the
request was written and may still be read and run), so it is NOT resendable. (Seen under load
with Docker: a request that never reached an idle helper, root cause not yet found.)"""


class ByteStream(Protocol):
    def send(self, data: bytes) -> None:
        """All of ``data``, or raise `OSError`: a send that raised has not handed on all of it."""
        ...

    def recv(self, size: int) -> bytes:
        """Up to ``size`` bytes; ``b""`` at end of stream."""
        ...

    def close(self) -> None:
        """Release the stream; a thread blocked in `recv` must wake (with ``b""`` or OSError)."""
        ...


class _Corrupt(Exception):
    """The helper's stream broke the framing: it is dropped."""


class MuxBroken(Exception):
    """The helper or its stream is gone; the owner should start a new one.

    ``may_resend`` is the one answer to "may the command in hand go to a fresh helper?": true
    only when no whole request of it was written (see the module's docstring); otherwise it may
    have run, or may still run, and the caller answers ``connection_lost``."""

    def __init__(self, reason: str, *, may_resend: bool = False) -> None:
        super().__init__(reason)
        self.may_resend = may_resend


@dataclass
class _Pending:
    output: OutputBuffer
    done: threading.Event = field(default_factory=threading.Event)
    exit_code: int | None = None
    timed_out: bool = False
    failure: str | None = None
    start_error: str | None = None
    not_native: bool = False
    """A file op the helper handed back (N): nothing was done, the script must run."""
    accepted_at: float | None = None
    """When the helper acknowledged the command (monotonic); ``None``: not (yet)."""
    on_output: Callable[[bytes], None] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    """The environment the caller gave the command: what `MuxClient.kill_tagged` matches."""


class MuxClient:
    def __init__(self, stream: ByteStream, *, hello_timeout: float = 15.0, ack_timeout: float = ACK_TIMEOUT) -> None:
        self._stream = stream
        self._ack_timeout = ack_timeout
        self._send_lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._pending_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._hello = threading.Event()
        self._outbox = Outbox()
        self.info: dict[str, object] = {}
        self.broken: str | None = None
        self.native_answers = 0
        """File ops the helper answered itself (`run_native`), so a test can prove which path ran."""
        self.native_declined = 0
        """File ops the helper handed back to the script (``N``)."""
        self._reader = threading.Thread(target=self._read_loop, name="mux-reader", daemon=True)
        self._reader.start()
        self._send(b"P", 0)
        if not self._hello.wait(hello_timeout) or self.broken:
            self.close()
            raise MuxBroken(self.broken or f"exec helper did not say hello within {hello_timeout}s")

    @property
    def alive(self) -> bool:
        return self.broken is None

    def close(self) -> None:
        """Fail the commands in flight and close the stream, which wakes the reader thread."""
        self._break("exec helper closed")
        with contextlib.suppress(Exception):
            self._stream.close()

    def run(
        self,
        command: str,
        *,
        timeout: float | None,
        stdin: bytes | None,
        env: Mapping[str, str] | None,
        cwd: str | None,
        output_limit: int,
        on_output: Callable[[bytes], None] | None = None,
    ) -> p.ExecuteResponse:
        """Run one command; raise `MuxBroken` if the helper dies or stops answering.

        ``on_output`` sees every output chunk as it arrives (uncapped, in order), on the
        stream's reader thread, which serves every command: it must neither block nor raise."""
        ident, pending = self._register(_Pending(OutputBuffer(output_limit), on_output=on_output, env=dict(env or {})))
        started = time.monotonic()
        try:
            self._request(ident, command, env, cwd, timeout, stdin)
            if stdin is not None:
                _send_stdin(self, ident, stdin)
            self._await(ident, pending, time.monotonic(), timeout)
        finally:
            with self._pending_lock:
                self._pending.pop(ident, None)
        return _response(pending, timeout, started)

    def run_native(
        self, op: Sequence[str], stdin: bytes | None, *, timeout: float | None, output_limit: int
    ) -> p.ExecuteResponse | None:
        """A file op (`sandboxes._mux._files`: ``op`` is its name and the script's arguments)
        done by the helper itself, no process started; what the script would have answered,
        or ``None`` when it must run instead (this helper has no such op, or the target is one
        the script writes in place). `MuxBroken` as `run`: once the F frame was written the op
        may have been done, so it is never resent."""
        names = self.info.get("native")
        if not isinstance(names, list) or not op or op[0] not in names:
            return None
        ident, pending = self._register(_Pending(OutputBuffer(output_limit)))
        started = time.monotonic()
        try:
            try:
                self._send(b"F", ident, json.dumps({"op": list(op)}).encode("utf-8"))
            except MuxBroken as broken:  # no whole F frame was written: nothing can have been done
                raise MuxBroken(str(broken), may_resend=True) from broken
            if stdin is not None:  # a write's bytes; a read has none
                _send_stdin(self, ident, stdin, pending.done)
            self._await(ident, pending, time.monotonic(), timeout)
        finally:
            with self._pending_lock:
                self._pending.pop(ident, None)
        if pending.not_native and pending.failure is None:
            self.native_declined += 1
            return None
        response = _response(pending, timeout, started)
        self.native_answers += 1
        return response

    def _register(self, pending: _Pending) -> tuple[int, _Pending]:
        """A new command id with ``pending`` waiting on it; `MuxBroken` (resendable: nothing
        was written) if the stream is broken, before or while registering (`_fail_all` may have
        missed it)."""
        if self.broken:
            raise MuxBroken(self.broken, may_resend=True)
        ident = next(self._ids)
        with self._pending_lock:
            self._pending[ident] = pending
        if self.broken:
            with self._pending_lock:
                self._pending.pop(ident, None)
            raise MuxBroken(self.broken, may_resend=True)
        return ident, pending

    def _request(
        self,
        ident: int,
        command: str,
        env: Mapping[str, str] | None,
        cwd: str | None,
        timeout: float | None,
        stdin: bytes | None,
    ) -> None:
        """The R frame; a failure to send it means no whole request reached the helper (see
        `_send`), so the command may be resent."""
        frame = _request_frame(ident, command, env, cwd, timeout, stdin is not None)
        try:
            self._send_frame(frame)
        except MuxBroken as broken:
            raise MuxBroken(str(broken), may_resend=True) from broken

    def kill_tagged(self, name: str, value: str) -> int:
        """Kill (as its timeout would: the whole tree) every running command that was given
        ``name=value`` in its environment; how many there were.

        Found by what the caller asked for, not by what the command's processes now hold: a
        command can drop the variable or overwrite its environment in memory, so a search of
        /proc for it may find nothing."""
        with self._pending_lock:
            idents = [ident for ident, item in self._pending.items() if item.env.get(name) == value]
        if idents:
            self._outbox.flush(self)  # a kill must follow its command's request, never overtake it
        for ident in idents:
            with contextlib.suppress(MuxBroken):
                self._send(b"K", ident)
        return len(idents)

    def kill_marked(self, name: str, value: str, timeout: float = _KILL_MARKED_WAIT) -> bool:
        """Have the helper kill every process of the sandbox whose environment holds
        ``name=value`` (`sandboxes._kill.kill_marked`, run in the helper itself: no process is
        started, so it works when the sandbox's process limit is reached); whether none was
        left. ``False`` also when the helper failed, broke or did not answer within ``timeout``."""
        if not name or not value:
            raise ValueError("an empty marker would match every command's processes")
        try:
            ident, pending = self._register(_Pending(OutputBuffer(0)))
        except MuxBroken:
            return False
        try:
            self._send(b"M", ident, json.dumps({"name": name, "value": value}).encode("utf-8"))
            pending.done.wait(timeout)
        except MuxBroken:
            return False
        finally:
            with self._pending_lock:
                self._pending.pop(ident, None)
        return pending.failure is None and pending.start_error is None and pending.exit_code == 0

    # ------------------------------------------------------------------ internals

    def _await(self, ident: int, pending: _Pending, sent: float, timeout: float | None) -> None:
        """Wait for the command's end, breaking the stream if it is not acknowledged within
        the acknowledgement timeout, and killing it if it is not reported within its own timeout
        (counted from the acknowledgement) plus a grace.

        The caller sleeps through the acknowledgement (the reader thread records it): most
        commands end before the acknowledgement timeout, and waking this thread for the
        acknowledgement alone would cost every command two more thread switches."""
        while not pending.done.is_set():
            now = time.monotonic()
            if pending.accepted_at is None:
                if now >= sent + self._ack_timeout:
                    self._break(f"exec helper did not acknowledge command {ident} within {self._ack_timeout}s")
                    raise MuxBroken(self.broken or "no acknowledgement")  # written: its fate is unknown
                until: float | None = sent + self._ack_timeout
                if timeout and now < sent + timeout + _KILL_GRACE:  # the earliest it may be overdue
                    until = min(sent + self._ack_timeout, sent + timeout + _KILL_GRACE)
            elif timeout:
                until = pending.accepted_at + timeout + _KILL_GRACE
                if now >= until:
                    self._send(b"K", ident)
                    if not pending.done.wait(_KILL_GRACE):
                        self._break(f"exec helper did not report command {ident} after its timeout")
                    return
            else:
                until = None
            pending.done.wait(None if until is None else until - now)

    def _send(self, kind: bytes, ident: int, payload: bytes = b"") -> None:
        """One frame, whole, or `MuxBroken` with nothing more ever written on this stream: a
        frame after a failed (partial) send would complete it into something the helper acts
        on. A frame of a command that is broken off is not sent either."""
        self._send_frame(HEADER.pack(kind, ident, len(payload)) + payload)

    def _send_frame(self, frame: bytes) -> None:
        with self._send_lock:
            if self.broken is not None:
                raise MuxBroken(self.broken)
            try:
                self._stream.send(frame)
            except OSError as exc:
                self._break(f"exec helper stream failed: {exc}")
                raise MuxBroken(self.broken or str(exc)) from exc

    def _read_loop(self) -> None:
        """Read whatever the stream has and dispatch every whole frame in it: one ``recv`` per
        burst rather than two per frame (output chunks and the exit often arrive together).

        Every byte is the sandbox's, so hostile: a frame of an unknown kind, longer than
        `MAX_FRAME` or whose payload does not parse drops the stream at once (the helper, seeing
        it closed, kills its commands), and the buffer never outgrows one frame and one read."""
        buffer = bytearray()
        try:
            while True:
                chunk = self._stream.recv(_RECV_SIZE)
                if not chunk:
                    raise EOFError
                buffer += chunk
                while len(buffer) >= HEADER.size:
                    kind, ident, length = HEADER.unpack_from(buffer)
                    if length > MAX_FRAME or kind[0] not in _KINDS:
                        raise _Corrupt(self._explain_garbage(kind, length, buffer))
                    end = HEADER.size + length
                    if len(buffer) < end:
                        break
                    payload = bytes(buffer[HEADER.size : end])
                    del buffer[:end]
                    try:
                        self._dispatch(kind, ident, payload)
                    except (ValueError, KeyError, TypeError) as exc:
                        raise _Corrupt(f"frame {kind!r}: {exc}") from exc
        except _Corrupt as exc:
            self._break(f"exec helper stream corrupt ({exc}); dropped")
        except (EOFError, OSError, struct.error, ValueError) as exc:
            self._break(f"exec helper stream ended ({type(exc).__name__})")
        finally:
            with contextlib.suppress(Exception):  # nobody reads it any more: release it
                self._stream.close()

    def _explain_garbage(self, kind: bytes, length: int, buffer: bytearray) -> str:
        """Before the hello, what came is most likely not a helper but a message from whatever
        failed to start it (``OCI runtime exec failed: ... python3: not found``): quote its
        start, bounded and escaped, so the log says why."""
        if self._hello.is_set():
            return f"frame {kind!r} of {length} bytes"
        return f"not an exec helper; it said {bytes(buffer[:_QUOTED_GARBAGE])!r}"

    def _dispatch(self, kind: bytes, ident: int, payload: bytes) -> None:
        if kind == b"H":
            info = json.loads(payload)
            if not isinstance(info, dict):
                raise ValueError(f"hello {info!r}")
            self.info = info
            self._hello.set()
            return
        with self._pending_lock:
            pending = self._pending.get(ident)
        if pending is None:
            return
        if kind == b"A":
            pending.accepted_at = time.monotonic()
        elif kind == b"O":
            pending.output.write(payload)
            if pending.on_output is not None:
                pending.on_output(payload)
        elif kind == b"X":
            status = json.loads(payload)
            code, timed_out = status["code"], status["timed_out"]
            if not (code is None or type(code) is int) or type(timed_out) is not bool:
                raise ValueError(f"exit status {status!r}")
            pending.exit_code, pending.timed_out = code, timed_out
            pending.done.set()
        elif kind == b"E":
            pending.start_error = payload.decode("utf-8", "replace")
            pending.done.set()
        elif kind == b"N":
            pending.not_native = True
            pending.done.set()

    def _break(self, reason: str) -> None:
        if self.broken is None:
            self.broken = reason
        self._hello.set()
        self._fail_all(reason)

    def _fail_all(self, reason: str) -> None:
        with self._pending_lock:
            pending = list(self._pending.values())
        for item in pending:
            if not item.done.is_set():
                item.failure = reason
                item.done.set()  # also releases a caller still waiting for the acknowledgement


def _request_frame(
    ident: int, command: str, env: Mapping[str, str] | None, cwd: str | None, timeout: float | None, stdin: bool
) -> bytes:
    """The R frame of a command."""
    spec = {"command": command, "env": dict(env or {}), "cwd": cwd, "timeout": timeout or None, "stdin": stdin}
    payload = json.dumps(spec).encode("utf-8")
    return HEADER.pack(b"R", ident, len(payload)) + payload


def kill_tagged(mux: MuxClient | None, name: str, value: str) -> bool:
    """`sandboxes.base.KillsTagged.kill_tagged` through a sandbox's running helper (``None`` or
    broken: ``False``, nothing done): the commands in flight given ``name=value``, then every
    process carrying it. Never starts a helper: starting one needs a process in the sandbox."""
    if mux is None or not mux.alive:
        return False
    mux.kill_tagged(name, value)
    return mux.kill_marked(name, value)


# ---------------------------------------------------------------------- awaiting on an event loop

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


async def arun(
    client: MuxClient,
    command: str,
    *,
    timeout: float | None,  # noqa: ASYNC109 - the command's own, enforced by the helper
    stdin: bytes | None,
    env: Mapping[str, str] | None,
    cwd: str | None,
    output_limit: int,
    on_output: Callable[[bytes], None] | None = None,
) -> p.ExecuteResponse:
    """`MuxClient.run` for an event loop: the command is awaited, no thread waits on it (a
    service would otherwise hold one thread per running command). Same frames, same timeouts,
    same `MuxBroken`."""
    loop = asyncio.get_running_loop()
    ended: list[asyncio.Future[None]] = [loop.create_future()]
    """What the waiting coroutine awaits now: resolved by the command's end (or a timer), then
    replaced if it must wait on."""

    def settle() -> None:
        _resolve(ended[0])

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle)

    waiting = _Pending(OutputBuffer(output_limit), done=_WakingEvent(wake), on_output=on_output, env=dict(env or {}))
    ident, pending = client._register(waiting)
    started = time.monotonic()
    queued: Queued | None = None
    try:
        if stdin is None:  # the request goes out with the others of this turn of the loop
            queued = client._outbox.put(client, loop, ident, _request_frame(ident, command, env, cwd, timeout, False))
            if queued is None:
                raise MuxBroken(client.broken or "exec helper stream broken", may_resend=True)
        else:  # its stdin frames must follow it: written at once, in order
            client._request(ident, command, env, cwd, timeout, stdin)
            if len(stdin) <= _SEND_INLINE:
                _send_stdin(client, ident, stdin)
            else:
                await asyncio.to_thread(_send_stdin, client, ident, stdin)
        await _await_async(client, ident, pending, ended, time.monotonic(), timeout)
        return _response(pending, timeout, started)
    except MuxBroken as broken:
        if queued is not None and client._outbox.withdraw(client, queued):  # no whole request was written
            raise MuxBroken(str(broken), may_resend=True) from broken
        raise
    finally:
        if queued is not None:  # cancelled before its turn: never written, so it never runs
            client._outbox.withdraw(client, queued)
        with client._pending_lock:
            client._pending.pop(ident, None)


def _response(pending: _Pending, timeout: float | None, started: float) -> p.ExecuteResponse:
    """What a finished command answers; `MuxBroken` if the stream failed under it."""
    if pending.failure is not None:
        raise MuxBroken(pending.failure)  # after the request was written: its fate is unknown
    if pending.not_native:  # only a file op may be handed back: a forged frame
        raise MuxBroken("exec helper answered a command as a file op")
    if pending.start_error is not None:
        code: p.ErrorCode = p.FILE_NOT_FOUND if "FileNotFoundError" in pending.start_error else p.BACKEND_ERROR
        return p.ExecuteResponse("", error=code, message=f"could not start command: {pending.start_error}")
    return execute_response(
        pending.output,
        pending.exit_code,
        timed_out=pending.timed_out,
        timeout=timeout,
        duration_ms=(time.monotonic() - started) * 1000,
    )


def _send_stdin(client: MuxClient, ident: int, stdin: bytes, answered: threading.Event | None = None) -> None:
    """Stdin in chunks, then its end; stops early once ``answered`` (a file op the helper already
    answered or handed back: it drops the rest)."""
    for offset in range(0, len(stdin), _STDIN_CHUNK):
        if answered is not None and answered.is_set():
            return
        client._send(b"I", ident, stdin[offset : offset + _STDIN_CHUNK])
    client._send(b"C", ident)


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
        if pending.accepted_at is None:
            if now >= sent + client._ack_timeout:
                client._break(f"exec helper did not acknowledge command {ident} within {client._ack_timeout}s")
                raise MuxBroken(client.broken or "no acknowledgement")  # written: its fate is unknown
            until: float | None = sent + client._ack_timeout
            if timeout and now < sent + timeout + _KILL_GRACE:
                until = min(sent + client._ack_timeout, sent + timeout + _KILL_GRACE)
        elif timeout:
            until = pending.accepted_at + timeout + _KILL_GRACE
            if now >= until:
                client._send(b"K", ident)
                give_up = time.monotonic() + _KILL_GRACE
                while not pending.done.is_set() and time.monotonic() < give_up:
                    await _woken(ended, max(0.0, give_up - time.monotonic()))
                if not pending.done.is_set():
                    client._break(f"exec helper did not report command {ident} after its timeout")
                return
        else:
            until = None
        await _woken(ended, None if until is None else max(0.0, until - now))
