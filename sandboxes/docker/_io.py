"""Byte-level plumbing for the Docker backend: the exec attach stream and tar archives."""

from __future__ import annotations

import contextlib
import io
import socket
import struct
import tarfile
import time
from collections.abc import Iterable, Iterator
from typing import Any

_FRAME = struct.Struct(">BxxxL")
_SLICE = 4 << 20

MAX_ARCHIVE_MEMBERS = 10_000
"""Members one archive put into a sandbox may have. Each becomes an inode on the sandbox's
workspace (and, without a ``disk`` limit, on the engine's disk), and the engine extracts the
whole archive in one call that nobody can interrupt; callers with more split or refuse."""


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


def tar_stream(files: Iterable[tuple[str, bytes]], *, uid: int, gid: int) -> Iterator[bytes | memoryview]:
    """A tar of regular files, named relative to where it will be extracted, owned by uid:gid,
    produced piece by piece: headers, then slices of the callers' own bytes (no copy, no spool
    to disk), so a big upload is never held whole in memory a second time."""
    now = time.time()
    for path, content in files:
        info = tarfile.TarInfo(path.lstrip("/"))
        info.size, info.mode, info.mtime, info.uid, info.gid = len(content), 0o644, now, uid, gid
        yield info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
        view = memoryview(content)
        for offset in range(0, len(view), _SLICE):
            yield view[offset : offset + _SLICE]
        if len(content) % tarfile.BLOCKSIZE:
            yield tarfile.NUL * (tarfile.BLOCKSIZE - len(content) % tarfile.BLOCKSIZE)
    yield tarfile.NUL * (tarfile.BLOCKSIZE * 2)


class _ChunkReader(io.RawIOBase):
    """A file object over an iterator of byte chunks, for `tarfile` in stream mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(target), len(self._buffer))
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size


def read_single_file(chunks: Iterator[bytes]) -> bytes | None:
    """The content of the first member of a tar stream (``get_archive`` of one path), or
    ``None`` when that member is not a regular file."""
    with tarfile.open(fileobj=io.BufferedReader(_ChunkReader(chunks), 1 << 20), mode="r|") as archive:
        for member in archive:
            if not member.isfile():
                return None
            extracted = archive.extractfile(member)
            return extracted.read() if extracted is not None else None
    return None
