"""How ``upload_files`` moves a batch: small files inline (base64 in JSON, a few per request),
big ones as a one-member tar streamed to ``PUT /archive``; and how ``download_files`` words a
file it streamed as a tar (``GET /archive``) because it was too large to answer inline.

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
from typing import cast, get_args

from sandboxes import protocol as p
from sandboxes.client._wire import ClientConfig
from sandboxes.client.errors import ConnectionLost, OperationFailed
from sandboxes.paths import InvalidPathError, normalize_path
from sandboxes.semantics import download_share, message_for, refused_input, share_refusal

__all__ = [
    "TAR_OVERHEAD",
    "Bound",
    "Inline",
    "Outcome",
    "Plan",
    "Step",
    "Tarred",
    "TooLarge",
    "file_from_tar",
    "plan_uploads",
    "tar_failure",
    "tar_of_one",
]

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


def tar_failure(step: Tarred, exc: OperationFailed | ConnectionLost) -> Outcome:
    """A tarred file's failure, worded as every backend words it."""
    if isinstance(exc, ConnectionLost):
        return p.CONNECTION_LOST, exc.message
    code = cast("p.ErrorCode", exc.code)
    return code, message_for(code, step.path)


@dataclass(frozen=True, slots=True)
class Bound:
    """Each streamed file's bound in a download batch: ``share``, its share of the batch's for
    ``files`` files, never above ``most`` (the client's ``max_download_bytes``)."""

    share: int
    files: int
    most: int

    @classmethod
    def of_batch(cls, config: ClientConfig, files: int) -> Bound:
        share = download_share(config.max_download_bytes, config.max_batch_download_bytes, files)
        return cls(share, files, config.max_download_bytes)

    def answer(self, path: str, outcome: bytes | p.ErrorCode) -> p.FileDownloadResponse:
        """A streamed file's response: its bytes, or its error worded as every backend words it."""
        if isinstance(outcome, bytes):
            return p.FileDownloadResponse(path, outcome)
        if outcome == p.FILE_TOO_LARGE and self.share < self.most:
            return p.FileDownloadResponse(path, None, outcome, share_refusal(path, self.share, self.files))
        too_large = f"larger than {self.most} bytes (the client's max_download_bytes)"
        detail = too_large if outcome == p.FILE_TOO_LARGE else None
        return p.FileDownloadResponse(path, None, outcome, message_for(outcome, path, detail))

    def failed(self, path: str, exc: OperationFailed | ConnectionLost) -> p.FileDownloadResponse:
        """A streamed file's response when its archive failed (the service's code, or the loss)."""
        if isinstance(exc, ConnectionLost):
            return p.FileDownloadResponse(path, None, p.CONNECTION_LOST, exc.message)
        known: dict[str, p.ErrorCode] = {"too_large": p.FILE_TOO_LARGE, "backend_unavailable": p.UNAVAILABLE}
        code: p.ErrorCode = known.get(exc.code) or (
            cast("p.ErrorCode", exc.code) if exc.code in get_args(p.ErrorCode) else p.BACKEND_ERROR
        )
        return p.FileDownloadResponse(path, None, code, message_for(code, path, exc.message))
