"""Client of the in-sandbox exec helper (`sandboxes._helper._server`), over any byte stream.

A transport (a ``docker exec`` attach socket, an SSH channel, a local pipe) only has to offer
`ByteStream`; the client multiplexes concurrent commands over it, applies the output cap, and
turns a dead stream into a clear error for every command in flight. A command's frames are
`sandboxes._mux._frames`'s, the helper's source as shipped `sandboxes._mux._shipped`'s; their
public names are importable from here too.

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
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from sandboxes import protocol as p
from sandboxes._helper._kill import MARKER_ENV
from sandboxes._helper.frames import (
    FILE_OP,
    KILL,
    KILL_MARKED,
    PING,
)
from sandboxes._mux._command import Command
from sandboxes._mux._frames import (
    _BINARY_ANSWERS,
    HEADER,
    MAX_FRAME,
    _Pending,
    _request_frame,
    _response,
    _send_stdin,
    wire_spec,
)
from sandboxes._mux._outbox import Outbox, Queued
from sandboxes._mux._reader import StreamReader
from sandboxes._mux._shipped import ON_DEMAND_OPS, PYTHON_FLAGS, SERVER_SOURCE, sources_of
from sandboxes._mux._stream import ByteStream, MuxBroken, TimedByteStream
from sandboxes._output import OutputBuffer, OutputHook

__all__ = [
    "ACK_TIMEOUT",
    "HEADER",
    "KILL_GRACE",
    "MAX_FRAME",
    "PYTHON_FLAGS",
    "SERVER_SOURCE",
    "MuxClient",
    "command_marker",
    "kill_tagged",
    "wire_spec",
]

KILL_GRACE = 10.0
"""Seconds past a command's timeout before the client stops trusting the helper to report it."""
_KILL_MARKED_WAIT = 30.0
"""Seconds to wait for the helper's answer to a kill by marker (two phases of at most 10 s)."""

ACK_TIMEOUT = 15.0
"""Seconds to wait for the helper to acknowledge a command before the stream is declared broken:
a hung helper or stream becomes an error instead of a hang. The command's fate is unknown (the
request was written and may still be read and run), so it is NOT resendable. (Seen under load
with Docker: a request that never reached an idle helper, root cause not yet found.)"""


class MuxClient(StreamReader):
    """Commands over one helper's stream, from any number of threads (and event loops: `arun`).

    Who reads the stream: one thread at a time, the holder of the read token. Over a plain
    `ByteStream`, always the reader thread. Over a `TimedByteStream`, a caller that finds the
    token free once its command is written (no other command is being read) takes it and reads
    its own answer, dispatching whatever else arrives meanwhile, so no thread is woken for its
    own answer. A caller that finds it taken waits, as on a plain stream, and the reader thread
    reads for it once the holder is done. Nobody holds the token while sending, and a caller
    that sends stdin has the reader thread read meanwhile: the helper writes blocking.
    Nobody reads an idle timed stream, so a caller that takes the token first reads what is
    there without waiting: a helper that died meanwhile is found before the request is written,
    and the command can go to a fresh one (`MuxBroken.may_resend`), as when the reader thread
    saw it die. Once the client serves an event loop (`arun`), the reader thread reads always:
    nobody else could notice a death between two awaited commands."""

    def __init__(self, stream: ByteStream, *, hello_timeout: float = 15.0, ack_timeout: float = ACK_TIMEOUT) -> None:
        self._stream = stream
        self._recv_within = stream.recv_within if isinstance(stream, TimedByteStream) else None
        self._always_read = self._recv_within is None
        """Whether the reader thread reads at all times (a plain stream, or a client `arun`
        serves); else only while commands it must read for are in flight."""
        self._reading = threading.Lock()
        """The read token: who holds it may read the stream and parse `_buffer`."""
        self._buffer = bytearray()
        self._wanted = threading.Event()
        """Set when the reader thread is needed: a command waits that no caller reads for."""
        self._wanted.set()  # for the hello
        self._ack_timeout = ack_timeout
        self._send_lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._pending_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._hello = threading.Event()
        self._outbox = Outbox()
        self._announced: str | None = None
        self._new_marker: Callable[[], str] | None = None
        self._markers_lock = threading.Lock()
        self.info: dict[str, object] = {}
        self.broken: str | None = None
        self.native_answers = 0
        """File ops the helper answered itself (`run_native`), so a test can prove which path ran."""
        self.native_declined = 0
        """File ops the helper handed back to the script (``N``)."""
        self._shipped_ops: set[str] = set()
        """The `ON_DEMAND_OPS` whose modules this helper was sent (`run_native`)."""
        self._reader = threading.Thread(target=self._read_loop, name="mux-reader", daemon=True)
        self._reader.start()
        self._send(PING, 0)
        if not self._hello.wait(hello_timeout) or self.broken:
            reason = self.broken or f"exec helper did not say hello within {hello_timeout}s"
            self.close(reason)
            raise MuxBroken(reason)

    @property
    def alive(self) -> bool:
        """Whether the stream still works, as far as can be told now. Over a timed stream that
        nobody is reading, this reads what is there (without waiting): nobody else would."""
        if self.broken is None and not self._always_read and self._reading.acquire(blocking=False):
            try:
                self._read_what_is_there()
            finally:
                self._hand_on()
        return self.broken is None

    def close(self, reason: str = "exec helper closed") -> None:
        """Fail the commands in flight (``reason``) and close the stream, which wakes the reader
        thread, and a send blocked on a helper that stopped reading."""
        self._break(reason)
        with contextlib.suppress(Exception):
            self._stream.close()

    def run(self, command: Command, on_output: OutputHook | None = None) -> p.ExecuteResponse:
        """Run one command as it stands (its ``cwd`` and ``env`` as given: `Command.within` is
        the caller's); raise `MuxBroken` if the helper dies or stops answering.

        ``on_output`` sees every output chunk as it arrives (uncapped, in order), on whichever
        thread reads the stream (this one, another caller's or the reader thread), which reads
        for every command: it must neither block nor raise."""
        self._look()
        stdin, timeout = command.stdin, command.timeout
        ident, pending = self.register(_Pending.of(command, on_output))
        started = time.monotonic()
        leading = False
        try:
            if stdin is not None:
                self._want_reader()  # someone must read while this thread sends
            self.request(ident, command)
            if stdin is not None:
                _send_stdin(self, ident, stdin)
            leading = self._lead()
            self._await(ident, pending, time.monotonic(), timeout, leading)
        finally:
            self._done_with(ident, leading)
        return _response(pending, timeout, started)

    def run_native(
        self, op: Sequence[str], stdin: bytes | None, *, timeout: float | None, output_limit: int
    ) -> p.ExecuteResponse | None:
        """A file op (`sandboxes._helper._files`: ``op`` is its name and the script's arguments)
        done by the helper itself, no process started; what the script would have answered,
        or ``None`` when it must run instead (this helper has no such op, or the target is one
        the script writes in place). `MuxBroken` as `run`: once the F frame was written the op
        may have been done, so it is never resent."""
        names = self.info.get("native")
        if not isinstance(names, list) or not op or op[0] not in names:
            return None
        self._look()
        ident, pending = self.register(_Pending(OutputBuffer(output_limit)))
        started = time.monotonic()
        leading = False
        try:
            if stdin is not None:  # a write's bytes; a read has none
                self._want_reader()  # someone must read while this thread sends
            try:
                self._send(FILE_OP, ident, wire_spec(self._file_op_spec(op)))
            except MuxBroken as broken:  # no whole F frame was written: nothing can have been done
                raise MuxBroken(str(broken), may_resend=True) from broken
            self._shipped_ops.add(op[0])
            if stdin is not None:
                _send_stdin(self, ident, stdin, pending.done)
            leading = self._lead()
            self._await(ident, pending, time.monotonic(), timeout, leading)
        finally:
            self._done_with(ident, leading)
        if pending.not_native and pending.failure is None:
            self.native_declined += 1
            return None
        response = _response(pending, timeout, started, latin1=op[0] in _BINARY_ANSWERS)
        self.native_answers += 1
        return response

    def _file_op_spec(self, op: Sequence[str]) -> dict[str, object]:
        """An F request: the op, and the modules it needs when they are `ON_DEMAND` and this
        helper was not sent them yet."""
        modules = ON_DEMAND_OPS.get(op[0])
        if modules is None or op[0] in self._shipped_ops:
            return {"op": list(op)}
        return {"op": list(op), "sources": sources_of(*modules)}

    def marker(self, new: Callable[[], str]) -> str:
        """A marker (the value of ``SANDBOXES_EXEC_ID``) for a caller that marks its commands
        itself: the service, whose kills by marker may come from outside this helper. It is the
        one announced to the helper with an earlier command (`_announcement`), if one is waiting
        to be handed out, else a fresh one. Once the announcing command is answered, the helper
        starts a shell with the announced marker in its environment (`_command._next_key`), which
        the command given that marker takes if it also comes with the same env otherwise and the
        same cwd. ``new`` makes markers (unique: a kill by marker must hit one command); it is
        kept to make the markers announced."""
        with self._markers_lock:
            self._new_marker = new
            current, self._announced = self._announced or new(), None
            return current

    def _announcement(self, env: Mapping[str, str]) -> str | None:
        """The marker to announce with a command about to be written (already registered) given
        ``env``: the one `marker` hands out next, made now if none is waiting. Only for a caller
        that marks its commands (`marker` was asked), only where the helper starts shells ahead
        (``warm``), and only while nothing else is in flight: concurrent commands would take
        each other's announced markers out of turn, and every answer would start a shell that
        nobody takes (under load, twice the processes). The same marker is announced again
        until it is handed out: one shell for it is started, however often."""
        if MARKER_ENV not in env or self.info.get("warm") is not True:
            return None
        with self._markers_lock:
            if self._new_marker is None or self._in_flight() > 1:
                return None
            if self._announced is None:
                self._announced = self._new_marker()
            return self._announced

    def _in_flight(self) -> int:
        with self._pending_lock:
            return sum(1 for item in self._pending.values() if not item.done.is_set())

    def register(self, pending: _Pending) -> tuple[int, _Pending]:
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

    def _look(self) -> None:
        """Before a request is written: over an idle timed stream (the read token free), read
        what came meanwhile, without waiting (an end, most likely), so that a helper that died
        is found while the command can still go to a fresh one (`MuxBroken`, resendable). The
        token is given back at once: nobody holds it while sending (see `_lead`)."""
        if self._always_read or not self._reading.acquire(blocking=False):
            return
        try:
            self._read_what_is_there()
        finally:
            self._hand_on()
        if self.broken is not None:
            raise MuxBroken(self.broken, may_resend=True)

    def _lead(self) -> bool:
        """Whether this caller, done sending, reads the stream itself until its command is
        answered: it took the free read token of a timed stream. If not, the reader thread is
        asked to read for it. The token is taken only once every frame of the command is
        written: the helper writes its answers blocking, so a sender that held it could wait
        for the helper while the helper waits for a reader, which only the token's holder is."""
        if self._always_read or not self._reading.acquire(blocking=False):
            self._want_reader()
            return False
        return True

    def _done_with(self, ident: int, leading: bool) -> None:
        """Forget the command; a caller that read hands reading on."""
        with self._pending_lock:
            self._pending.pop(ident, None)
        if leading:
            self._hand_on()

    def serve_async(self) -> None:
        """From now on the reader thread reads at all times (`arun`'s callers do not read)."""
        if not self._always_read:
            self._always_read = True
            self._wanted.set()

    def request(self, ident: int, command: Command) -> None:
        """``command``'s R frame (its stdin, if any, is the caller's to send next); a failure to
        send it means no whole request reached the helper (see `_send`), so the command may be
        resent."""
        announced = self._announcement(command.env)
        frame = _request_frame(ident, command, stdin_open=command.stdin is not None, next_marker=announced)
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
                self._send(KILL, ident)
        return len(idents)

    def kill_marked(self, name: str, value: str, timeout: float = _KILL_MARKED_WAIT) -> bool:
        """Have the helper kill every process of the sandbox whose environment holds
        ``name=value`` (`sandboxes._helper._kill.kill_marked`, run in the helper itself: no process is
        started, so it works when the sandbox's process limit is reached); whether none was
        left. ``False`` also when the helper failed, broke or did not answer within ``timeout``."""
        if not name or not value:
            raise ValueError("an empty marker would match every command's processes")
        try:
            self._look()
            ident, pending = self.register(_Pending(OutputBuffer(0)))
        except MuxBroken:
            return False
        leading = False
        try:
            self._send(KILL_MARKED, ident, wire_spec({"name": name, "value": value}))
            leading = self._lead()
            self._wait_for(pending, timeout, leading)
        except MuxBroken:
            return False
        finally:
            self._done_with(ident, leading)
        return pending.failure is None and pending.start_error is None and pending.exit_code == 0

    # ------------------------------------------------------------------ internals

    def _await(self, ident: int, pending: _Pending, sent: float, timeout: float | None, leading: bool) -> None:
        """Wait for the command's end (reading the stream meanwhile when ``leading``), breaking
        the stream if it is not acknowledged within the acknowledgement timeout, and killing it
        if it is not reported within its own timeout (counted from the acknowledgement) plus a
        grace.

        A caller that does not read sleeps through the acknowledgement (the reader thread
        records it): most commands end before the acknowledgement timeout, and waking this
        thread for the acknowledgement alone would cost every command two more thread switches."""
        wait = self._waiter(pending, leading)
        while not pending.done.is_set():
            now = time.monotonic()
            overdue, until = self.deadline(ident, pending, sent, timeout, now)
            if overdue:
                self.send_kill(ident)
                if not self._wait_for(pending, KILL_GRACE, leading):
                    self.unreported(ident)
                return
            wait(None if until is None else until - now)

    # ------------------------------------------------------------------ for `_awaited.arun`

    def queue_request(self, loop: asyncio.AbstractEventLoop, ident: int, command: Command) -> Queued | None:
        """A stdin-less command's R frame (a ``command.stdin`` is the caller's to send with
        `request` instead), queued for the end of ``loop``'s turn; ``None``: broken."""
        frame = _request_frame(ident, command, stdin_open=False, next_marker=self._announcement(command.env))
        return self._outbox.put(self, loop, ident, frame)

    def withdraw(self, queued: Queued) -> bool:
        """Take back a `queue_request` not written yet; whether it is certainly unsent."""
        return self._outbox.withdraw(self, queued)

    def forget(self, ident: int) -> None:
        """Stop waiting for command ``ident`` (answered, or given up on)."""
        with self._pending_lock:
            self._pending.pop(ident, None)

    def send_kill(self, ident: int) -> None:
        """K: the helper kills command ``ident`` (its timeout passed)."""
        self._send(KILL, ident)

    def unreported(self, ident: int) -> None:
        """Command ``ident`` was killed and not reported within `KILL_GRACE`: the stream is broken."""
        self._break(f"exec helper did not report command {ident} after its timeout")

    def deadline(
        self, ident: int, pending: _Pending, sent: float, timeout: float | None, now: float
    ) -> tuple[bool, float | None]:
        """For a command waited on since ``sent``: (whether it is overdue and must be killed,
        when to look again; ``None``: at its end only). Breaks the stream, and raises
        `MuxBroken`, when it was not acknowledged in time. One ladder for `_await` and for
        `sandboxes._mux._awaited.arun`, which only wait differently."""
        if pending.accepted_at is None:
            if now >= sent + self._ack_timeout:
                self._break(f"exec helper did not acknowledge command {ident} within {self._ack_timeout}s")
                raise MuxBroken(self.broken or "no acknowledgement")  # written: its fate is unknown
            if timeout and now < sent + timeout + KILL_GRACE:  # the earliest it may be overdue
                return False, min(sent + self._ack_timeout, sent + timeout + KILL_GRACE)
            return False, sent + self._ack_timeout
        if timeout:
            until = pending.accepted_at + timeout + KILL_GRACE
            return now >= until, until
        return False, None

    def _wait_for(self, pending: _Pending, seconds: float, leading: bool) -> bool:
        """Whether ``pending`` ended within ``seconds`` (read for when ``leading``)."""
        end = time.monotonic() + seconds
        wait = self._waiter(pending, leading)
        while not pending.done.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return False
            wait(left)
        return True

    def _waiter(self, pending: _Pending, leading: bool) -> Callable[[float | None], object]:
        """How a caller waits a while for ``pending``: reading the stream itself (``leading``),
        or asleep until the reader thread (or another caller) reports its end."""
        return self._pump if leading else pending.done.wait

    def _send(self, kind: bytes, ident: int, payload: bytes | memoryview = b"") -> None:
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


def kill_tagged(mux: MuxClient | None, name: str, value: str) -> bool:
    """`sandboxes.base.KillsTagged.kill_tagged` through a sandbox's running helper (``None`` or
    broken: ``False``, nothing done): the commands in flight given ``name=value``, then every
    process carrying it. Never starts a helper: starting one needs a process in the sandbox."""
    if mux is None or not mux.alive:
        return False
    mux.kill_tagged(name, value)
    return mux.kill_marked(name, value)


def command_marker(mux: MuxClient | None, new: Callable[[], str]) -> str:
    """`sandboxes.base.MarksAhead.command_marker` through a sandbox's running helper (none or
    broken: a fresh marker from ``new``)."""
    if mux is None or mux.broken is not None:
        return new()
    return mux.marker(new)
