"""Faults of an exec helper's stream, for the tests that a command is never run twice and that
one never sent is sent again (`sandboxes._mux.MuxBroken.may_resend`), the same in every
backend.

`FaultyStream` is a TEST DOUBLE of a broken network, wrapped around a transport's REAL stream: the
helper, the transport (docker's attach socket, the SSH channel, the jail's pipes, the exec
WebSocket) and the sandbox stay real; only the loss is staged, at a moment a real drop cannot be
made to hit on purpose."""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from sandboxes import protocol as p
from sandboxes._mux import ByteStream, MuxClient, TimedByteStream

__all__ = [
    "FaultyStream",
    "TimedFaultyStream",
    "assert_a_stopped_helper_cannot_hold_a_big_send",
    "assert_an_unanswered_command_runs_once",
    "assert_an_unsent_command_is_resent",
    "faulty",
    "wrapped",
]

_HEADER = struct.Struct(">cII")


class FaultyStream:
    """A real `ByteStream` that can lose what the helper answers, or fail a request's send."""

    def __init__(self, inner: ByteStream) -> None:
        self.inner = inner
        self._losing = False
        self._lost = bytearray()
        self._fail_request = False
        self.failed_sends = 0
        self.sends_after_failure = 0
        self._lock = threading.Lock()

    def lose_answers(self) -> None:
        """From now on the client gets nothing the helper says, and once the helper has reported
        a command's exit the stream ends: the request was written and the command ran, but the
        connection dropped with its acknowledgement (and everything after) still in transit."""
        self._losing = True

    def fail_next_request(self) -> None:
        """The next request (R frame, or F: a native file op) is half written, then the send raises: the connection
        broke in the middle of the write, so no whole request reached the helper."""
        self._fail_request = True

    def send(self, data: bytes) -> None:
        with self._lock:
            if self.failed_sends:
                self.sends_after_failure += 1
            if self._fail_request and data[:1] in (b"R", b"F"):
                self._fail_request = False
                self.failed_sends += 1
                self.inner.send(data[: len(data) // 2])
                raise BrokenPipeError("the connection broke during the write (staged)")
        self.inner.send(data)

    def recv(self, size: int) -> bytes:
        while True:
            data = self.inner.recv(size)
            if not self._losing or not data:
                return data
            self._lost += data
            if _has_exit(self._lost):
                return b""

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # what a transport reads off its own stream (stderr, status)
        if name == "recv_within":  # only `TimedFaultyStream` has it, losing answers the same way
            raise AttributeError(name)
        return getattr(self.inner, name)


class TimedFaultyStream(FaultyStream):
    """`FaultyStream` around a `TimedByteStream` (SSH's channel, the jail's pipes): a caller
    alone with its command reads its answer through `recv_within`, which loses it the same way."""

    def __init__(self, inner: TimedByteStream) -> None:
        super().__init__(inner)
        self.timed = inner

    def recv_within(self, size: int, timeout: float | None) -> bytes | None:
        data = self.timed.recv_within(size, timeout)
        if not self._losing or not data:
            return data
        self._lost += data
        return b"" if _has_exit(self._lost) else None


def wrapped(inner: ByteStream) -> FaultyStream:
    """The `FaultyStream` for ``inner``: timed if it is."""
    return TimedFaultyStream(inner) if isinstance(inner, TimedByteStream) else FaultyStream(inner)


def _has_exit(data: bytearray) -> bool:
    """Whether ``data`` (whole frames from the helper, perhaps a partial last one) holds an exit."""
    offset = 0
    while offset + _HEADER.size <= len(data):
        kind, _ident, length = _HEADER.unpack_from(data, offset)
        if offset + _HEADER.size + length > len(data):
            return False
        if kind in (b"X", b"E"):
            return True
        offset += _HEADER.size + length
    return False


def faulty(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> list[FaultyStream]:
    """Every exec helper ``module`` starts from now on talks through a `FaultyStream`; the list
    of them, newest last."""
    made: list[FaultyStream] = []

    def client(stream: ByteStream, **options: Any) -> MuxClient:
        made.append(wrapped(stream))
        return MuxClient(made[-1], **options)

    monkeypatch.setattr(module, "MuxClient", client)
    return made


def assert_an_unanswered_command_runs_once(sandbox: Any, streams: list[FaultyStream], path: str) -> None:
    """A command written to the helper, run, but whose acknowledgement never came back: the
    caller gets ``connection_lost``, and the command ran exactly once (a resend would run it
    again on the next helper)."""
    assert sandbox.execute("true").exit_code == 0
    helpers = len(streams)
    assert helpers, "the sandbox did not start its exec helper through the patched client"
    streams[-1].lose_answers()
    result = sandbox.execute(f"echo ran >> {path}")
    assert result.error == p.CONNECTION_LOST, result
    after = sandbox.execute(f"cat {path}")
    assert len(streams) == helpers + 1, "the next command did not go to a new helper"
    assert after.output == "ran\n", f"the command ran {after.output.count('ran')} times"


def assert_an_unsent_command_is_resent(sandbox: Any, streams: list[FaultyStream], path: str) -> None:
    """A command whose request could not be written whole: sent again, transparently, to a new
    helper, where it runs once; nothing more went over the failed stream."""
    assert sandbox.execute("true").exit_code == 0
    helpers = len(streams)
    assert helpers, "the sandbox did not start its exec helper through the patched client"
    failing = streams[-1]
    failing.fail_next_request()
    result = sandbox.execute(f"echo ran >> {path}; echo done")
    assert (result.error, result.output) == (None, "done\n"), result
    assert failing.failed_sends == 1
    assert failing.sends_after_failure == 0, "the client wrote on a stream after a failed send"
    assert len(streams) == helpers + 1, "the command did not go to a new helper"
    assert sandbox.execute(f"cat {path}").output == "ran\n"


def assert_a_stopped_helper_cannot_hold_a_big_send(
    sandbox: Any, monkeypatch: pytest.MonkeyPatch, what: str, signal_helper: Callable[[str], None]
) -> None:
    """A command can stop its own helper (``kill -STOP``: the same user); the client's send of a
    big write's bytes or a command's stdin then blocks once the buffers on the way are full,
    before any deadline is looked at. A send that takes no frame for `STALL` seconds
    (`sandboxes._mux._stall`, 2 s here) ends the client: ``connection_lost`` (it may have run),
    in time, and the next command gets a new helper. ``what``: ``write`` (a native write into
    /tmp) or ``stdin``; ``signal_helper("STOP")`` / ``("CONT")`` signals the running helper
    from outside the sandbox's commands."""
    from sandboxes._mux import _stall as stall

    monkeypatch.setattr(stall, "STALL", 2.0)
    assert sandbox.execute("true").exit_code == 0
    signal_helper("STOP")
    started = time.monotonic()
    try:
        if what == "write":
            error = sandbox.write("/tmp/big.txt", "x" * (32 << 20)).error
        else:
            error = sandbox.execute("cat > /dev/null", stdin=b"x" * (32 << 20), timeout=600).error
    finally:
        signal_helper("CONT")
    assert error == p.CONNECTION_LOST, (error, time.monotonic() - started)
    assert time.monotonic() - started < 30
    assert sandbox.execute("echo back").output == "back\n"
