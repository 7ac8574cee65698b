"""Byte-level plumbing for the Docker backend: the exec attach stream."""

from __future__ import annotations

import contextlib
import io
import socket
import struct
import time
from typing import Any

_FRAME = struct.Struct(">BxxxL")
_READ = 1 << 20


class ExecSocket:
    """The hijacked connection of a ``docker exec`` without a TTY, as a plain byte stream.

    Docker multiplexes the process's stdout and stderr on it in frames (1 byte stream id, 3
    padding, 4 bytes length); `recv` returns stdout bytes and keeps stderr aside for diagnostics,
    or, with ``merge_stderr``, returns both in the order they were written (a user's command).
    """

    def __init__(self, docker_socket: Any, *, merge_stderr: bool = False) -> None:
        self._merge = merge_stderr
        self._holder = docker_socket  # keeps docker-py's response (and so the socket) alive
        self._sock: socket.socket = getattr(docker_socket, "_sock", docker_socket)
        self._pending = b""
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
        while True:
            if self._frame_left == 0:
                header = self._read_exact(_FRAME.size)
                if not header:
                    return b""
                self._frame_kind, self._frame_left = _FRAME.unpack(header)
                continue
            wanted = self._frame_kind == 1 or self._merge
            data = self._sock.recv(min(size, self._frame_left) if wanted else self._frame_left)
            if not data:
                return b""
            self._frame_left -= len(data)
            if wanted:
                return data
            if len(self.stderr) < 65536:
                self.stderr += data

    def _read_exact(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self._sock.recv(size - len(data))
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


def read_exec_stdout(
    api: Any, container: str, argv: list[str], *, user: str, timeout: float
) -> tuple[int | None, bytes]:
    """(exit code, stdout) of ``argv`` run in its own ``docker exec``, stdout read raw as it
    comes into one buffer (no second copy of a big file), stderr kept apart. ``None`` as the
    code when the stream broke or stayed silent for ``timeout`` seconds."""
    exec_id = api.exec_create(container, argv, user=user, stdout=True, stderr=True)["Id"]
    stream = ExecSocket(api.exec_start(exec_id, socket=True))
    stream.settimeout(timeout)
    content = io.BytesIO()
    try:
        while chunk := stream.recv(_READ):
            content.write(chunk)
    except OSError:  # silent past the timeout (TimeoutError), or the engine dropped it
        return None, b""
    finally:
        stream.close()
    for _ in range(100):  # the stream ends as the process exits; its status may trail a little
        state = api.exec_inspect(exec_id)
        if not state["Running"]:
            return state["ExitCode"], content.getvalue()  # getvalue hands over the buffer itself
        time.sleep(0.01)
    return None, b""
