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
        for _ in range(100):  # the stream ends as the process exits; its status may trail a little
            state = self._api.exec_inspect(self._exec_id)
            if not state["Running"]:
                return int(state["ExitCode"])
            time.sleep(0.01)
        return None

    def close(self) -> None:
        self._stream.close()


def read_exec_stdout(
    api: Any, container: str, argv: list[str], *, user: str, timeout: float
) -> tuple[int | None, bytes]:
    """(exit code, stdout) of ``argv`` run in its own ``docker exec``, stdout read raw as it
    comes into one buffer (no second copy of a big file), stderr kept apart. ``None`` as the
    code when the stream broke or stayed silent for ``timeout`` seconds."""
    exec_id = api.exec_create(container, argv, user=user, stdout=True, stderr=True)["Id"]
    output = ExecOutput(api, exec_id, ExecSocket(api.exec_start(exec_id, socket=True)), timeout=timeout)
    content = io.BytesIO()
    try:
        while chunk := output.recv(_READ):
            content.write(chunk)
    finally:
        output.close()
    code = output.exit_code()
    return (code, content.getvalue()) if code is not None else (None, b"")  # getvalue: the buffer itself
