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
from collections.abc import Generator, Iterator
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
