"""How ``upload_files`` moves a batch: small files inline (base64 in JSON, a few per request),
big ones as a one-member tar streamed to ``PUT /archive``.

Base64 in JSON costs a third more bytes and holds the whole body in memory on both sides, and
the service caps JSON bodies; a tar stream has neither cost. The answers do not change with the
transport: a big file onto a directory is still ``is_directory``, below a file still
``not_a_directory``, and a bad path is refused here as every backend refuses it.

The plan is a generator (like `BaseSandbox`'s operations) so the sync and async handles share
it: it yields `Inline` and `Tarred` steps in the caller's order (a later write of the same path
still wins) and receives each step's outcome.
"""

from __future__ import annotations

import tarfile
import time
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass

from sandboxes import protocol as p
from sandboxes.client._wire import ClientConfig
from sandboxes.paths import InvalidPathError, normalize_path
from sandboxes.semantics import message_for, refused_input

_BLOCK = 512
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Inline:
    files: list[tuple[str, bytes]]


@dataclass(frozen=True, slots=True)
class Tarred:
    path: str
    directory: str
    name: str
    data: bytes


Step = Inline | Tarred
Outcome = list[p.FileUploadResponse] | tuple[p.ErrorCode | None, str | None]
"""An inline batch's responses; a tarred file's error code (``None``: written) and message."""

Plan = Generator[Step, Outcome, list[p.FileUploadResponse]]


def plan_uploads(files: list[tuple[str, bytes]], config: ClientConfig) -> Plan:
    results: list[p.FileUploadResponse | None] = [None] * len(files)
    batch: list[int] = []
    size = 0

    def flush() -> Generator[Step, Outcome, None]:
        nonlocal batch, size
        if batch:
            outcome = yield Inline([files[i] for i in batch])
            assert isinstance(outcome, list)
            for index, response in zip(batch, outcome, strict=True):
                results[index] = response
        batch, size = [], 0

    for index, (raw, data) in enumerate(files):
        if len(data) <= config.inline_upload_bytes:
            if batch and size + len(data) > config.max_batch_bytes:
                yield from flush()
            batch.append(index)
            size += len(data)
            continue
        yield from flush()
        try:
            path = normalize_path(raw)
        except InvalidPathError as exc:
            results[index] = p.FileUploadResponse(raw, *refused_input(exc, raw))
            continue
        if path == "/":
            results[index] = p.FileUploadResponse(raw, p.IS_DIRECTORY, message_for(p.IS_DIRECTORY, path))
            continue
        directory, _, name = path.rpartition("/")
        outcome = yield Tarred(path, directory or "/", name, data)
        assert isinstance(outcome, tuple)
        results[index] = p.FileUploadResponse(raw, *outcome)
    yield from flush()
    return [response for response in results if response is not None]


def tar_of_one(name: str, data: bytes) -> Iterator[bytes]:
    """A tar stream with the single regular file ``name``, its content never copied whole."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = int(time.time())
    yield info.tobuf(format=tarfile.PAX_FORMAT)
    view = memoryview(data)
    for offset in range(0, len(data), _CHUNK):
        yield bytes(view[offset : offset + _CHUNK])
    yield b"\0" * ((_BLOCK - len(data) % _BLOCK) % _BLOCK + 2 * _BLOCK)


TAR_OVERHEAD = 1 << 20
"""What a one-file tar may hold besides the file's bytes (its headers, padding and end): a
stream longer than the file's bound by more is refused while it arrives."""


class TooLarge(Exception):
    """A streamed download went past its bound."""


class _Bounded:
    """A file-like view of a chunk stream that counts what arrives and refuses past ``limit``."""

    def __init__(self, chunks: Iterable[bytes], limit: int) -> None:
        self._chunks = iter(chunks)
        self._limit = limit
        self._pending = b""
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        out = bytearray()
        while size < 0 or len(out) < size:
            if not self._pending:
                chunk = next(self._chunks, None)
                if chunk is None:
                    break
                self.count += len(chunk)
                if self.count > self._limit:
                    raise TooLarge()
                self._pending = chunk
            take = len(self._pending) if size < 0 else size - len(out)
            out += self._pending[:take]
            self._pending = self._pending[take:]
        return bytes(out)


def file_from_tar(chunks: Iterable[bytes], max_bytes: int) -> bytes | p.ErrorCode:
    """The single regular file of a one-member tar stream (``GET /archive`` of a file), read as
    it arrives and never past ``max_bytes`` of content (``file_too_large``); a member that is no
    regular file is ``invalid_argument``, a stream that is no tar ``backend_error``."""
    source = _Bounded(chunks, max_bytes + TAR_OVERHEAD)
    try:
        with tarfile.open(fileobj=source, mode="r|") as tar:  # type: ignore[call-overload]
            member = tar.next()
            if member is None or not member.isreg():
                return p.INVALID_ARGUMENT
            if member.size > max_bytes:
                return p.FILE_TOO_LARGE
            content = tar.extractfile(member)
            assert content is not None
            data: bytes = content.read(max_bytes + 1)
            return p.FILE_TOO_LARGE if len(data) > max_bytes else data
    except TooLarge:
        return p.FILE_TOO_LARGE
    except (tarfile.TarError, EOFError):
        return p.BACKEND_ERROR
