"""The round trips of `sandboxes.base.BaseSandbox`: `Call`, the bounds of what each may
send back, `Operation`, and the helpers that build a call or read its answer into a result.

An operation is a generator of `Call`s that returns its result; the sandbox drives it over
``execute`` (or its exec helper's native op), so everything here is free of any transport.
"""

from __future__ import annotations

import contextvars
import uuid
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from sandboxes import _scripts
from sandboxes import protocol as p
from sandboxes._output import UNLIMITED
from sandboxes.semantics import message_for, share_refusal

__all__ = [
    "DOWNLOAD_DETAILS",
    "GREP_OUTPUT_LIMIT",
    "MAX_BATCH_DOWNLOAD_BYTES",
    "MAX_DOWNLOAD_BYTES",
    "MAX_READ_BYTES",
    "OPERATION_ENV",
    "READ_SCAN_BYTES",
    "SEARCH_OUTPUT_LIMIT",
    "WRITE_OUTPUT_LIMIT",
    "Call",
    "Operation",
    "answer_room",
    "batch_failed",
    "join_or",
    "shared_refusals",
    "staging_name",
    "token",
    "upload_response",
    "write_call",
    "written_message",
]

R = TypeVar("R")

MAX_READ_BYTES = 256 << 20
"""Default bound of what a whole-file fetch may pull (`FilesystemConfig.max_file_bytes`);
``edit`` pulls at most `sandboxes.semantics.EDIT_MAX_BYTES`."""

READ_SCAN_BYTES = 8 << 20
"""``read`` looks at most at this many of a file's first bytes: a bigger file answers a window
within its complete lines there, or ``file_too_large`` (`sandboxes.semantics.read_window`)."""

MAX_BATCH_DOWNLOAD_BYTES = 1 << 30
"""Default bound of what one ``download_files`` batch holds in all
(`BaseSandbox.max_batch_download_bytes`)."""

MAX_DOWNLOAD_BYTES = 512 << 20
"""Default per-file bound of ``download_files`` (`BaseSandbox.max_download_bytes`): a bigger
file answers ``file_too_large``, its bytes never pulled."""

SEARCH_OUTPUT_LIMIT = 64 << 20
"""Cap on what ls/grep/glob may send back; beyond it results are marked truncated."""

GREP_OUTPUT_LIMIT = 2 * _scripts.GREP_PART_MAX + 4096
"""Cap on what a grep may send back: its two parts, each cut by the script, and their framing."""

WRITE_OUTPUT_LIMIT = 4096
"""Cap on what a write may send back: on success nothing, on failure a shell's complaint (read
for the error's detail only); more is a sandbox talking nonsense, and is not kept."""


@dataclass(frozen=True, slots=True)
class Call:
    """One round trip: what to run, what to feed it, and how much output to accept."""

    command: str
    stdin: bytes | None = None
    output_limit: int = UNLIMITED
    idempotent: bool = True
    """Whether running it twice is harmless: a transport that lost its connection may retry
    these (reads, listings, searches), and must not retry the others (writes, deletes)."""
    native: tuple[str, ...] | None = None
    """The same operation as an exec helper's native op (`sandboxes._helper._files`: its name and
    the script's arguments), which answers exactly what ``command`` would without starting a
    process; transports without one run ``command`` (see `BaseSandbox.native_file_ops`)."""


OPERATION_ENV: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "sandboxes_operation_env", default=None
)
"""Environment given to every command a file operation runs in this context (``None``: none):
the service marks an operation's commands with it, to kill them by marker once its client left."""


# An operation is a generator that yields the `Call`s it needs, receives each response, and
# returns its result. `_drive` runs it over `execute`, `_adrive` over `aexecute`.
Operation = Generator[Call, p.ExecuteResponse, R]


DOWNLOAD_DETAILS: dict[p.ErrorCode, str] = {
    p.INVALID_ARGUMENT: "not a regular file (a FIFO, a device or a socket)",
}


def answer_room(size: int) -> int:
    """Room for a file op's answer of ``size`` bytes of a file: raw, or as base64 lines (76
    characters and a newline for every 57 bytes), with a little for its framing."""
    return (size + 2) // 3 * 4 + size // 57 + 4096


def join_or(groups: list[list[str]]) -> list[str]:
    joined: list[str] = []
    for group in groups:
        if joined:
            joined.append("-o")
        joined.extend(group)
    return joined


def write_call(path: str, data: bytes) -> Call:
    """`_scripts.WRITE` of ``data`` to ``path``, with its native form."""
    args = (path, str(len(data)), token())
    command = _scripts.command(_scripts.WRITE, *args)
    return Call(command, data, WRITE_OUTPUT_LIMIT, idempotent=False, native=("write", *args))


def token() -> str:
    """Random enough that two writers never pick the same staging name beside one file."""
    return uuid.uuid4().hex[:16]


def staging_name(path: str) -> str:
    """A fresh hidden name beside ``path`` for a bulk transfer to fill before it is renamed over
    ``path`` (beside it, so the rename never crosses a filesystem)."""
    directory = path.rpartition("/")[0]
    return f"{directory}/.sandboxes-write.{token()}"


def upload_response(raw: str, code: p.ErrorCode | None, path: str) -> p.FileUploadResponse:
    if code is None:
        return p.FileUploadResponse(raw)
    return p.FileUploadResponse(raw, code, written_message(code, path))


def written_message(code: p.ErrorCode, path: str) -> str:
    """The sentence for a write's error: ``invalid_argument`` is always a special file refused."""
    if code == p.INVALID_ARGUMENT:
        return message_for(code, path, "not a regular file (a FIFO, device or socket); only regular files are written")
    return message_for(code, path)


def batch_failed(items: list[Any], kind: type[Any]) -> Callable[[p.ErrorCode, str], list[Any]]:
    """When a whole batch round trip fails, every item reports it, in order; nothing raises."""

    def report(code: p.ErrorCode, message: str) -> list[Any]:
        return [kind(item[0] if isinstance(item, tuple) else item, error=code, message=message) for item in items]

    return report


def shared_refusals(found: list[p.FileDownloadResponse], share: int, files: int) -> list[p.FileDownloadResponse]:
    """``found`` with its files over their ``share`` of the batch told so."""
    return [
        p.FileDownloadResponse(r.path, None, p.FILE_TOO_LARGE, share_refusal(r.path, share, files))
        if r.error == p.FILE_TOO_LARGE
        else r
        for r in found
    ]
