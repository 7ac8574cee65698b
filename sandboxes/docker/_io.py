"""Byte-level plumbing for the Docker backend: the exec attach stream."""

from __future__ import annotations

import contextlib
import io
import socket
import struct
import time
from collections.abc import Callable, Mapping
from typing import Any

_FRAME = struct.Struct(">BxxxL")
_READ = 1 << 20
_RECV = 1 << 16
"""Bytes asked of the socket at a time (at least): every frame of a burst in one system call."""


class ExecSocket:
    """The hijacked connection of a ``docker exec`` without a TTY, as a plain byte stream.

    Docker multiplexes the process's stdout and stderr on it in frames (1 byte stream id, 3
    padding, 4 bytes length); `recv` returns stdout bytes and keeps stderr aside for diagnostics,
    or, with ``merge_stderr``, returns both in the order they were written (a user's command).

    The socket blocks without limit: docker-py leaves its API client's request timeout on the
    hijacked connection, which turned a process's silence into an error (the exec helper,
    quiet while a command printed nothing, was dropped); an owner that wants silence bounded
    says so (`settimeout`).
    """

    def __init__(self, docker_socket: Any, *, merge_stderr: bool = False) -> None:
        self._merge = merge_stderr
        self._holder = docker_socket  # keeps docker-py's response (and so the socket) alive
        self._sock: socket.socket = getattr(docker_socket, "_sock", docker_socket)
        self._buffer = read_ahead(docker_socket, self._sock)
        self._sock.settimeout(None)
        self._peek = type(self._sock) is socket.socket  # TLS, SSH and paramiko streams take no recv flags
        self._taken = 0
        """What the socket gave and `recv` has not handed on yet: ``_buffer[_taken:]``."""
        self._frame_left = 0
        self._frame_kind = 1
        self.stderr = bytearray()

    def settimeout(self, seconds: float | None) -> None:
        self._sock.settimeout(seconds)

    def send(self, data: bytes) -> None:
        self._sock.sendall(data)

    def shutdown_write(self) -> None:
        """Close the process's stdin while still reading its output."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)

    def recv(self, size: int) -> bytes:
        """Up to ``size`` bytes of the process's output (stdout, or both with ``merge_stderr``),
        blocking only while none has come; ``b""`` at end of stream.

        The socket is read in big pieces and every frame already in hand is unwrapped at once:
        a burst of the exec helper (several commands' exits, each its own Docker frame) costs
        one system call and comes back as one piece, where reading each frame's header and
        body apart cost two per frame, and on the reader thread of a service each call gives
        the interpreter lock away and waits to get it back from the event loop."""
        parts: list[bytes] = []
        wanted_total = 0
        while wanted_total < size:
            if not parts or self._taken < len(self._buffer):
                piece = self._next_piece(size - wanted_total, block=not parts)
            else:
                break
            if piece is None:  # nothing more in hand without waiting
                break
            if not piece:  # end of stream: what came before it is still handed on
                break
            parts.append(piece)
            wanted_total += len(piece)
        return b"".join(parts)

    def _next_piece(self, size: int, *, block: bool) -> bytes | None:
        """The next wanted output bytes (at most ``size``), stderr set aside on the way;
        ``b""`` at end of stream, ``None`` when ``block`` is false and no more is in hand."""
        while True:
            if self._frame_left == 0:
                header = self._read_exact(_FRAME.size, block=block)
                if not header:
                    return header
                self._frame_kind, self._frame_left = _FRAME.unpack(header)
                continue
            wanted = self._frame_kind == 1 or self._merge
            data = self._take(min(size, self._frame_left) if wanted else self._frame_left, block=block)
            if not data:
                return data
            self._frame_left -= len(data)
            if wanted:
                return data
            if len(self.stderr) < 65536:
                self.stderr += data

    def _take(self, size: int, *, block: bool) -> bytes | None:
        """Up to ``size`` bytes of the stream (the socket is read only when nothing is in
        hand, and only if ``block``: else ``None``); ``b""`` at its end."""
        if self._taken >= len(self._buffer):
            if not block:
                return None
            chunk = self._recv_when_readable(max(_RECV, size))
            if not chunk:
                return b""
            self._buffer, self._taken = chunk, 0
        data = self._buffer[self._taken : self._taken + size]
        self._taken += len(data)
        return data

    def _recv_when_readable(self, size: int) -> bytes:
        """Up to ``size`` bytes of the socket, waited for without a buffer: a ``recv`` allocates
        what it asks for while it blocks, and an idle helper's reader waits for good."""
        if self._peek and not self._sock.recv(1, socket.MSG_PEEK):
            return b""
        return self._sock.recv(size)

    def _read_exact(self, size: int, *, block: bool) -> bytes | None:
        """A frame header: ``b""`` at end of stream; ``None`` when ``block`` is false and the
        whole header is not in hand (then nothing of it is taken)."""
        if not block and len(self._buffer) - self._taken < size:
            return None
        data = b""
        while len(data) < size:
            chunk = self._take(size - len(data), block=True)
            if not chunk:
                return b""
            data += chunk
        return data

    def close(self) -> None:
        """Shut the connection down first: closing a socket does not wake a thread blocked in
        its ``recv`` (the exec helper client's reader), shutting it down does."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()
        close = getattr(self._holder, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()


def read_ahead(docker_socket: Any, sock: socket.socket) -> bytes:
    """The process's first bytes, if the HTTP client already read them: docker-py hands over
    the raw socket under the response's buffered reader, which read the upgrade's headers in
    one gulp of up to 8 KiB and, when the process had written by then (a loaded machine; a
    command that prints at once), its first frames too. Read from the socket alone, they would
    be lost (an ``echo`` answering nothing with exit code 0, a small archive coming back empty). Taken
    without waiting (the socket is non-blocking for that one read): nothing in hand is ``b""``."""
    try:
        reader = docker_socket._response.raw._fp.fp
    except AttributeError:  # not docker-py's SocketIO (a plain socket in tests, TLS): no reader
        return b""
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        return bytes(reader.read1(_RECV) or b"")
    except OSError:
        return b""
    finally:
        sock.settimeout(timeout)


class ExecOutput:
    """The stdout of a ``docker exec`` of its own, read raw as it comes (`recv`), then its exit
    status (`exit_code`). Silence past the socket's timeout, or a dropped stream, ends it with
    an unknown status."""

    def __init__(self, api: Any, exec_id: str, stream: ExecSocket, *, timeout: float = 300.0) -> None:
        self._api = api
        self._exec_id = exec_id
        self._stream = stream
        self._broken = False
        stream.settimeout(timeout)

    @property
    def stderr(self) -> bytes:
        return bytes(self._stream.stderr)

    def recv(self, size: int) -> bytes:
        """Up to ``size`` bytes of stdout; ``b""`` at its end, however it ended."""
        try:
            return self._stream.recv(size)
        except OSError:  # silent past the timeout (TimeoutError), or the engine dropped it
            self._broken = True
            return b""

    def exit_code(self) -> int | None:
        """The exit status once the output ended; ``None`` when the stream broke."""
        if self._broken:
            return None
        return polled_exit_code(self._api, self._exec_id, interval=0.01, polls=100)

    def close(self) -> None:
        self._stream.close()


def exec_ended(info: Mapping[str, Any]) -> bool:
    """Whether an exec's inspection says it ended: not running, with an exit code. Before its
    process starts (a slow runtime, a container just unpaused) it is not running either, with no
    exit code yet."""
    return not info["Running"] and info["ExitCode"] is not None


def exit_recorded(info: Mapping[str, Any]) -> bool:
    """Whether an exec's inspection carries its exit code, whatever it says of running."""
    return info["ExitCode"] is not None


def polled_exit_code(
    api: Any,
    exec_id: str,
    *,
    interval: float,
    polls: int | None = None,
    within: float | None = None,
    ended: Callable[[Mapping[str, Any]], bool] = exec_ended,
) -> int | None:
    """The exit code of an exec whose output ended, once an inspection shows it ``ended``: the
    stream ends as the process exits, and the engine's record of the exit may trail it with no
    event to wait on, so it is inspected again every ``interval`` seconds. ``None`` once
    ``polls`` inspections, or ``within`` seconds, passed without it."""
    deadline = None if within is None else time.monotonic() + within
    done = 0
    while True:
        state = api.exec_inspect(exec_id)
        if ended(state):
            return int(state["ExitCode"])
        done += 1
        if (polls is not None and done >= polls) or (deadline is not None and time.monotonic() > deadline):
            return None
        time.sleep(interval)


def read_exec_stdout(
    api: Any, container: str, argv: list[str], *, user: str, timeout: float, max_bytes: int | None = None
) -> tuple[int | None, bytes]:
    """(exit code, stdout) of ``argv`` run in its own ``docker exec``, stdout read raw as it
    comes into one buffer (no second copy of a big file), stderr kept apart. ``None`` as the
    code when the stream broke or stayed silent for ``timeout`` seconds; `TOO_MUCH` when more
    than ``max_bytes`` came (the stream is dropped then, nothing more read)."""
    exec_id = api.exec_create(container, argv, user=user, stdout=True, stderr=True)["Id"]
    output = ExecOutput(api, exec_id, ExecSocket(api.exec_start(exec_id, socket=True)), timeout=timeout)
    content = io.BytesIO()
    try:
        while chunk := output.recv(_READ):
            content.write(chunk)
            if max_bytes is not None and content.tell() > max_bytes:
                return TOO_MUCH, b""
    finally:
        output.close()
    code = output.exit_code()
    return (code, content.getvalue()) if code is not None else (None, b"")  # getvalue: the buffer itself


TOO_MUCH = -17
"""`read_exec_stdout`'s code when the command sent more than it was allowed to."""
