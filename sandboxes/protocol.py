"""The backend protocol every sandbox and storage backend implements.

Names, argument names and semantics follow deepagents 0.7's backend protocol so that a thin
adapter (`sandboxes.integrations.deepagents`) turns any backend here into a deepagents one.
Two deliberate differences:

* ``error`` fields carry a code from a fixed vocabulary (`ErrorCode`), and ``message`` carries
  the human-readable sentence. Programs branch on the code; agents read the message.
* Results are frozen dataclasses (``FileInfo`` and ``GrepMatch`` too, which deepagents keeps as
  TypedDicts), so they compare by value, which the differential tests rely on.

Every method has an async twin (``als``, ``aread``, ...). The defaults run the sync method in a
worker thread; backends with a native async transport override them.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, ParamSpec, TypeVar


class NotIsolatedWarning(UserWarning):
    """Commands of this sandbox run with the caller's full privileges.

    Shared by every backend that can run without isolation (local, SSH), so it lives here
    rather than in one backend that the others would then have to import.
    """


ErrorCode = Literal[
    "file_not_found",
    "permission_denied",
    "is_directory",
    "not_a_directory",
    "invalid_path",
    "invalid_argument",
    "string_not_found",
    "multiple_occurrences",
    "not_a_text_file",
    "file_too_large",
    "file_changed",
    "offset_out_of_range",
    "no_space",
    "timeout",
    "out_of_memory",
    "connection_lost",
    "unavailable",
    "paused",
    "backend_error",
]
"""Every error a backend may report. ``backend_error`` is the catch-all for failures the backend
could not classify; its ``message`` says what happened."""

FILE_NOT_FOUND: Final = "file_not_found"
PERMISSION_DENIED: Final = "permission_denied"
IS_DIRECTORY: Final = "is_directory"
NOT_A_DIRECTORY: Final = "not_a_directory"
INVALID_PATH: Final = "invalid_path"
INVALID_ARGUMENT: Final = "invalid_argument"
STRING_NOT_FOUND: Final = "string_not_found"
MULTIPLE_OCCURRENCES: Final = "multiple_occurrences"
NOT_A_TEXT_FILE: Final = "not_a_text_file"
FILE_TOO_LARGE: Final = "file_too_large"
FILE_CHANGED: Final = "file_changed"
OFFSET_OUT_OF_RANGE: Final = "offset_out_of_range"
NO_SPACE: Final = "no_space"
TIMEOUT: Final = "timeout"
OUT_OF_MEMORY: Final = "out_of_memory"
CONNECTION_LOST: Final = "connection_lost"
UNAVAILABLE: Final = "unavailable"
PAUSED: Final = "paused"
"""The sandbox is paused (frozen): resume it first."""
BACKEND_ERROR: Final = "backend_error"

Encoding = Literal["utf-8", "base64"]


@dataclass(frozen=True, slots=True)
class FileInfo:
    """One entry of a listing. Directories carry a trailing ``/`` in ``path``."""

    path: str
    is_dir: bool = False
    size: int | None = None
    modified_at: str | None = None


@dataclass(frozen=True, slots=True)
class FileData:
    """File content as returned by ``read``: text as-is, binary as base64."""

    content: str
    encoding: Encoding = "utf-8"
    created_at: str | None = None
    modified_at: str | None = None


@dataclass(frozen=True, slots=True)
class GrepMatch:
    path: str
    line: int
    """1-based line number."""
    text: str


@dataclass(frozen=True, slots=True)
class _Result:
    error: ErrorCode | None = None
    message: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class LsResult(_Result):
    entries: list[FileInfo] | None = None


@dataclass(frozen=True, slots=True)
class ReadResult(_Result):
    """A window of a text file, or a whole binary file as base64.

    Pagination fields follow deepagents: ``start_line``/``end_line`` are 1-based and inclusive,
    ``next_offset`` is the 0-based offset of the first line not shown (``None`` at the end).
    """

    file_data: FileData | None = None
    total_lines: int | None = None
    start_line: int | None = None
    end_line: int | None = None
    next_offset: int | None = None
    no_lines_requested: bool = False


@dataclass(frozen=True, slots=True)
class WriteResult(_Result):
    path: str | None = None


@dataclass(frozen=True, slots=True)
class EditResult(_Result):
    path: str | None = None
    occurrences: int | None = None


@dataclass(frozen=True, slots=True)
class DeleteResult(_Result):
    path: str | None = None


@dataclass(frozen=True, slots=True)
class GrepResult(_Result):
    matches: list[GrepMatch] | None = None
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class GlobResult(_Result):
    matches: list[FileInfo] | None = None
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class FileUploadResponse:
    path: str
    error: ErrorCode | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class FileDownloadResponse:
    path: str
    content: bytes | None = None
    error: ErrorCode | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class ExecuteResponse:
    """Outcome of one command: stdout and stderr interleaved as they were written.

    ``exit_code`` is ``None`` when the command did not finish (``error`` says why, e.g.
    ``timeout``). ``truncated`` means ``output`` keeps only the head and the tail of what the
    command printed.
    """

    output: str
    exit_code: int | None = None
    truncated: bool = False
    error: ErrorCode | None = None
    message: str | None = None
    duration_ms: float | None = None
    extra: Mapping[str, object] = field(default_factory=dict)

    @property
    def timed_out(self) -> bool:
        return self.error == TIMEOUT


_P = ParamSpec("_P")
_T = TypeVar("_T")


async def _to_thread(call: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``asyncio.to_thread``, asyncio imported where awaited: a program that never awaits (a
    CLI call) does not import it with the protocol."""
    import asyncio

    return await asyncio.to_thread(call, *args, **kwargs)


class BackendProtocol(abc.ABC):
    """File operations over absolute virtual paths.

    Methods never raise for a bad path, a missing file or a refused operation: they return a
    result whose ``error`` says why. They raise only for programming errors and for a backend
    that cannot be reached at all.
    """

    @abc.abstractmethod
    def ls(self, path: str) -> LsResult: ...

    @abc.abstractmethod
    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult: ...

    @abc.abstractmethod
    def write(self, file_path: str, content: str) -> WriteResult: ...

    @abc.abstractmethod
    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult: ...

    @abc.abstractmethod
    def delete(self, file_path: str) -> DeleteResult: ...

    @abc.abstractmethod
    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> GrepResult: ...

    @abc.abstractmethod
    def glob(self, pattern: str, path: str | None = None) -> GlobResult: ...

    @abc.abstractmethod
    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]: ...

    @abc.abstractmethod
    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]: ...

    async def als(self, path: str) -> LsResult:
        return await _to_thread(self.ls, path)

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        return await _to_thread(self.read, file_path, offset, limit)

    async def awrite(self, file_path: str, content: str) -> WriteResult:
        return await _to_thread(self.write, file_path, content)

    async def aedit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:
        return await _to_thread(self.edit, file_path, old_string, new_string, replace_all)

    async def adelete(self, file_path: str) -> DeleteResult:
        return await _to_thread(self.delete, file_path)

    async def agrep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> GrepResult:
        return await _to_thread(lambda: self.grep(pattern, path, glob, max_count=max_count))

    async def aglob(self, pattern: str, path: str | None = None) -> GlobResult:
        return await _to_thread(self.glob, pattern, path)

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        return await _to_thread(self.upload_files, files)

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return await _to_thread(self.download_files, paths)


class SandboxBackendProtocol(BackendProtocol):
    """A backend that can also run commands: a container, a pod, a VM, a local jail."""

    @property
    @abc.abstractmethod
    def id(self) -> str: ...

    @abc.abstractmethod
    def execute(
        self,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int | None = None,
    ) -> ExecuteResponse:
        """Run ``command`` with ``sh -c`` inside the sandbox.

        ``timeout`` (seconds; ``None`` is the backend default, ``0`` none) kills the command's
        whole process tree when it expires. ``output_limit`` caps the bytes kept from the
        output (``None`` is the backend default); beyond it the head and tail are kept.
        """

    async def aexecute(
        self,
        command: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - forwarded to the sandbox, not an asyncio timeout
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int | None = None,
    ) -> ExecuteResponse:
        return await _to_thread(
            lambda: self.execute(command, timeout=timeout, stdin=stdin, env=env, cwd=cwd, output_limit=output_limit)
        )
