"""The reading side of `sandboxes._mux.client.MuxClient`: who holds the read token, reading
the helper's stream, cutting it into frames, and applying each to the command it answers.

Every byte is the sandbox's, so hostile: a frame of an unknown kind, longer than `MAX_FRAME`, or
whose payload does not parse drops the stream at once, and the buffer never outgrows one frame
and one read. A stream that breaks fails every command in flight with the reason.
"""

from __future__ import annotations

import contextlib
import json
import struct
import threading
import time
from collections.abc import Callable

from sandboxes._helper.frames import ACCEPTED, ERROR, EXIT, HELLO, NOT_NATIVE, OUTPUT, STDERR
from sandboxes._mux._frames import _KINDS, HEADER, MAX_FRAME, _Corrupt, _Pending
from sandboxes._mux._stream import ByteStream

__all__ = ["StreamReader"]

_RECV_SIZE = 1 << 16
_RECV_MOST = 1 << 18
"""What the reader asks for after a read that got all it asked for (the stream is backed up: a
relay's frames of 256 KiB); back to `_RECV_SIZE` after one that got less. Not always: a read
allocates what it asks for, and one answered with less (a command's few bytes) gives the rest
back, which for a buffer of 128 KiB or more costs far more than the read."""
_READER_SLICE = 0.05
"""Over a `TimedByteStream`, how long the reader thread waits for data at a time before it
checks whether any command still needs it (and, if none, hands reading back to the callers)."""
_QUOTED_GARBAGE = 300  # bytes of a non-helper's first words quoted in the error


class StreamReader:
    """The read token, the reader thread's loop and the dispatch of frames, for `MuxClient`
    (which sets every attribute declared here in its ``__init__``)."""

    _stream: ByteStream
    _recv_within: Callable[[int, float | None], bytes | None] | None
    _always_read: bool
    _reading: threading.Lock
    _buffer: bytearray
    _wanted: threading.Event
    _pending: dict[int, _Pending]
    _pending_lock: threading.Lock
    _hello: threading.Event
    info: dict[str, object]
    broken: str | None
    _read_size: int = _RECV_SIZE

    def _read_what_is_there(self) -> None:
        """Dispatch what the timed stream holds, without waiting (the read token's holder)."""
        while self.broken is None and self._pump(0):
            pass

    def _hand_on(self) -> None:
        """Give the read token back, and the reading to the reader thread if commands wait."""
        self._reading.release()
        if self._awaited():
            self._want_reader()

    def _want_reader(self) -> None:
        if not self._always_read:
            self._wanted.set()

    def _awaited(self) -> bool:
        """Whether anything in flight still waits for frames (the hello included)."""
        if not self._hello.is_set():
            return True
        with self._pending_lock:
            return any(not item.done.is_set() for item in self._pending.values())

    def _read_loop(self) -> None:
        """The reader thread: reads while it is needed (see the class docstring), until the
        client breaks. A stream that failed under it is closed by `_pump`; one the client gave
        up on (no acknowledgement) stays as it is until its owner closes it."""
        try:
            while self.broken is None:
                if not self._always_read:
                    self._wanted.wait()
                    self._wanted.clear()  # before looking: a later want sets it again
                with self._reading:
                    while self.broken is None and (self._always_read or self._awaited()):
                        self._pump(None if self._always_read else _READER_SLICE)
        except BaseException:
            self._drop("exec helper reader failed")
            raise

    def _pump(self, timeout: float | None) -> bool:
        """Read once, waiting at most ``timeout`` seconds on a timed stream (``None``: no limit;
        a plain stream always waits), and dispatch every whole frame: one ``recv`` per burst
        rather than two per frame (output chunks and the exit often arrive together). Whether
        anything came (an end of stream included). Only the read token's holder calls it.

        Every byte is the sandbox's, so hostile: a frame of an unknown kind, longer than
        `MAX_FRAME` or whose payload does not parse drops the stream at once (the helper, seeing
        it closed, kills its commands), and the buffer never outgrows one frame and one read."""
        try:
            size = self._read_size
            if self._recv_within is not None:
                chunk = self._recv_within(size, timeout)
                if chunk is None:
                    return False
            else:
                chunk = self._stream.recv(size)
            if not chunk:
                raise EOFError
            self._take(chunk)
            self._read_size = self._rest_of_frame() or (_RECV_MOST if len(chunk) == size else _RECV_SIZE)
        except _Corrupt as exc:
            self._drop(f"exec helper stream corrupt ({exc}); dropped")
        except (EOFError, OSError, struct.error, ValueError) as exc:
            self._drop(f"exec helper stream ended ({type(exc).__name__})")
        return True

    def _rest_of_frame(self) -> int:
        """What the next read asks for when the buffer holds the start of a big frame: the rest of
        it (at most `_RECV_MOST`), so that reads end where frames do; 0 otherwise. Its header
        was checked by `_frames` before it was buffered."""
        if len(self._buffer) < HEADER.size:
            return 0
        rest = HEADER.size + HEADER.unpack_from(self._buffer)[2] - len(self._buffer)
        return min(rest, _RECV_MOST) if rest > _RECV_SIZE else 0

    def _take(self, chunk: bytes) -> None:
        buffer = self._buffer
        if len(buffer) == HEADER.size and HEADER.unpack_from(buffer)[2] == len(chunk):
            kind, ident, _length = HEADER.unpack_from(buffer)  # a header read alone, then its payload:
            buffer.clear()
            self._dispatch_checked(kind, ident, chunk)  # the read is the payload, not copied
            return
        if not buffer:  # frames read whole are cut from the read itself, not copied through the buffer
            with memoryview(chunk) as view:
                taken = self._frames(view)
                buffer += view[taken:]  # the partial frame left, copied once
            return
        buffer += chunk
        with memoryview(buffer) as view:
            taken = self._frames(view)
        del buffer[:taken]

    def _frames(self, data: memoryview) -> int:
        """Dispatch every whole frame at the start of ``data``; how many bytes they took. Each
        payload is one copy of its bytes."""
        taken = 0
        while len(data) - taken >= HEADER.size:
            kind, ident, length = HEADER.unpack_from(data, taken)
            if length > MAX_FRAME or kind[0] not in _KINDS:
                raise _Corrupt(self._explain_garbage(kind, length, data[taken:]))
            end = taken + HEADER.size + length
            if len(data) < end:
                break
            payload = bytes(data[taken + HEADER.size : end])
            taken = end
            self._dispatch_checked(kind, ident, payload)
        return taken

    def _dispatch_checked(self, kind: bytes, ident: int, payload: bytes) -> None:
        try:
            self._dispatch(kind, ident, payload)
        except (ValueError, KeyError, TypeError) as exc:
            raise _Corrupt(f"frame {kind!r}: {exc}") from exc

    def _drop(self, reason: str) -> None:
        """The stream broke under its reader: fail everything, and release it."""
        self._break(reason)
        with contextlib.suppress(Exception):
            self._stream.close()

    def _explain_garbage(self, kind: bytes, length: int, buffer: memoryview) -> str:
        """Before the hello, what came is most likely not a helper but a message from whatever
        failed to start it (``OCI runtime exec failed: ... python3: not found``): quote its
        start, bounded and escaped, so the log says why."""
        if self._hello.is_set():
            return f"frame {kind!r} of {length} bytes"
        return f"not an exec helper; it said {bytes(buffer[:_QUOTED_GARBAGE])!r}"

    def _dispatch(self, kind: bytes, ident: int, payload: bytes) -> None:
        if kind == HELLO:
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
        if kind == ACCEPTED:
            pending.accepted_at = time.monotonic()
        elif kind in (OUTPUT, STDERR):  # one buffer: the merged answer, bounded together
            pending.output.write(payload)
            if pending.on_output is not None:
                pending.on_output(payload, "stdout" if kind == OUTPUT else "stderr")
        elif kind == EXIT:
            status = json.loads(payload)
            code, timed_out = status["code"], status["timed_out"]
            if not (code is None or type(code) is int) or type(timed_out) is not bool:
                raise ValueError(f"exit status {status!r}")
            pending.exit_code, pending.timed_out = code, timed_out
            pending.done.set()
        elif kind == ERROR:
            pending.start_error = payload.decode("utf-8", "replace")
            pending.done.set()
        elif kind == NOT_NATIVE:
            pending.not_native = True
            pending.done.set()
        elif pending.on_frame is not None:  # a capability's own kind, for its channel
            pending.on_frame(kind, payload)

    def _break(self, reason: str) -> None:
        if self.broken is None:
            self.broken = reason
        self._hello.set()
        self._wanted.set()  # a waiting reader thread ends
        self._fail_all(reason)

    def _fail_all(self, reason: str) -> None:
        with self._pending_lock:
            pending = list(self._pending.values())
        for item in pending:
            if not item.done.is_set():
                item.failure = reason
                item.done.set()  # also releases a caller still waiting for the acknowledgement
