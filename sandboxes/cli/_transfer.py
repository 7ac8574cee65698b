"""Tar streams for ``sandboxes cp``: made from a local tree while it is being sent, and
extracted while it arrives, so a copy of any size needs neither memory nor a temporary file."""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from sandboxes import protocol as p
from sandboxes.cli._common import Failed, note

_CHUNK = 1 << 16


@contextlib.contextmanager
def tar_stream(path: Path, name: str) -> Iterator[IO[bytes]]:
    """A readable tar of ``path`` (a file or a tree) as the single top-level member ``name``,
    written by a thread into a pipe as the reader consumes it.

    Closing the reader (the upload failed) breaks the pipe, which stops the writer. A local
    read error ends the archive early and is raised after the upload, whatever the service made
    of the truncated archive: what was extracted by then stays, as with ``docker cp``.
    """
    read_fd, write_fd = os.pipe()
    reader = os.fdopen(read_fd, "rb")
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            with (
                os.fdopen(write_fd, "wb") as writer,
                tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar,
            ):
                tar.add(path, arcname=name)
        except BrokenPipeError:
            pass  # the reader gave up; its own error is the one to report
        except Exception as exc:
            failure.append(exc)

    def local_failure() -> Failed | None:
        reader.close()
        thread.join()
        if not failure:
            return None
        exc = failure[0]
        code = p.PERMISSION_DENIED if isinstance(exc, PermissionError) else p.BACKEND_ERROR
        return Failed(code, f"reading {path}: {exc}")

    thread = threading.Thread(target=produce, name="sandboxes-cp-tar", daemon=True)
    thread.start()
    try:
        yield reader
    except BaseException as exc:
        # A truncated archive makes the service fail too; the local cause is the one to tell.
        local = local_failure()
        if local is not None:
            raise local from exc
        raise
    local = local_failure()
    if local is not None:
        raise local


class _ChunkReader(io.RawIOBase):
    """An iterator of byte chunks as a file, for tarfile's stream mode."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk)
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def extract(chunks: Iterable[bytes], into: Path, *, rename: str | None) -> None:
    """Extract a tar stream whose single top-level member is what was copied under ``into``,
    that member renamed to ``rename`` if given.

    tarfile's ``data`` filter keeps everything inside ``into``: no absolute names, no ``..``, no
    links leading out, no devices, no set-id bits, no ownership from the archive. A member it
    refuses (a sandbox's symlink to ``/etc/passwd``) is skipped with a note, not fatal.
    """
    if not hasattr(tarfile, "data_filter"):  # Python < 3.11.4
        raise Failed(p.BACKEND_ERROR, "copying out of a sandbox needs Python >= 3.11.4 (tar extraction filters)")

    def safe(member: tarfile.TarInfo, destination: str) -> tarfile.TarInfo | None:
        try:
            return tarfile.data_filter(member, destination)
        except tarfile.FilterError as exc:
            note(f"sandboxes: skipped {member.name}: {exc}")
            return None

    stream = io.BufferedReader(_ChunkReader(chunks), _CHUNK)
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            tar.extractall(into, members=_renamed(tar, rename), filter=safe)  # noqa: S202 - data filter
    except tarfile.TarError as exc:
        raise Failed(p.BACKEND_ERROR, f"the sandbox sent a broken archive: {exc}") from exc


def _renamed(tar: tarfile.TarFile, rename: str | None) -> Iterator[tarfile.TarInfo]:
    top: str | None = None
    for member in tar:
        first, _, rest = member.name.removeprefix("./").partition("/")
        top = first if top is None else top
        if first != top:
            raise Failed(p.BACKEND_ERROR, f"the archive has more than one top-level entry ({top!r}, {first!r})")
        if rename is not None:
            member.name = f"{rename}/{rest}" if rest else rename
            if member.islnk() and member.linkname.partition("/")[0] == top:
                member.linkname = rename + member.linkname[len(top) :]
        yield member
