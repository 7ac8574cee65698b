"""Use any backend of this package as a deepagents 0.7 backend.

``to_deepagents(backend)`` wraps one of our backends in a subclass of deepagents' own
``BackendProtocol`` (or ``SandboxBackendProtocol`` when ours can run commands), because
deepagents decides what an agent may do with ``isinstance`` checks, not duck typing.

The operations already share deepagents' names and semantics, so only the result shapes change:

* Our frozen dataclasses become deepagents' dataclasses; ``FileInfo``, ``GrepMatch`` and
  ``FileData`` become its TypedDicts, with an optional key left out rather than set to ``None``
  (its consumers test for presence).
* deepagents has a single ``error`` string. Upload and download responses get our CODE: their
  consumers compare it to deepagents' ``FileOperationError`` literals (``file_not_found`` means
  "skip quietly" in the skills and memory middleware). Every other result gets our ``message``,
  the sentence the agent reads; ``ls`` errors also carry the code, because deepagents' delete
  permission check looks for the substring ``not_a_directory`` in them.
* ``execute`` failures that deepagents has no field for go into ``output``; a timeout becomes
  exit code 124, the convention of deepagents' local shell.

deepagents keeps what it takes out of the context (tool results too large for it, summarized
history, binary blocks) in files under ``/large_tool_results/``, ``/conversation_history/`` and
``/blobs/``, at the root, which every sandbox keeps read-only: the write would fail and the model
would get the whole result. So a sandbox's view routes those directories
(`sandboxes.composite`) to a backend that can hold them, an in-memory `StateBackend` of the view
unless the caller gives one (``artifacts``). Commands do not see those files; the file tools do.
"""

from __future__ import annotations

from typing import ClassVar, Final, overload

from deepagents.backends import protocol as da

from sandboxes import protocol as p
from sandboxes.composite import CompositeBackend
from sandboxes.state import StateBackend

TIMEOUT_EXIT_CODE = 124
"""What ``timeout(1)`` and deepagents' ``LocalShellBackend`` report for a command that ran out
of time."""

ARTIFACT_DIRS: Final = ("/large_tool_results/", "/conversation_history/", "/blobs/")
"""Where deepagents' middleware writes what it evicts from the context (its artifacts root ``/``)."""

_TRANSFER_ERRORS: dict[p.ErrorCode, str] = {
    p.FILE_NOT_FOUND: da.FILE_NOT_FOUND,
    p.PERMISSION_DENIED: da.PERMISSION_DENIED,
    p.IS_DIRECTORY: da.IS_DIRECTORY,
    p.INVALID_PATH: da.INVALID_PATH,
    # A parent that is a file: deepagents' FilesystemBackend maps NotADirectoryError here too.
    p.NOT_A_DIRECTORY: da.INVALID_PATH,
}
"""Our codes as deepagents' ``FileOperationError`` literals; codes without an equivalent pass
through as they are (deepagents allows backend-specific strings)."""


def _message(result: p._Result) -> str | None:
    if result.error is None:
        return None
    return result.message or result.error


def _transfer_error(code: p.ErrorCode | None) -> str | None:
    return None if code is None else _TRANSFER_ERRORS.get(code, code)


def _file_data(data: p.FileData) -> da.FileData:
    converted: da.FileData = {"content": data.content, "encoding": data.encoding}
    if data.created_at is not None:
        converted["created_at"] = data.created_at
    if data.modified_at is not None:
        converted["modified_at"] = data.modified_at
    return converted


def _grep_match(match: p.GrepMatch) -> da.GrepMatch:
    return {"path": match.path, "line": match.line, "text": match.text}


class DeepAgentsBackend(da.BackendProtocol):
    """A deepagents backend over one of ours; ``backend`` is the wrapped one."""

    # deepagents' own backends disagree on two details, and its standard sandbox suite checks
    # ``BaseSandbox``'s choice, so each class here copies its deepagents counterpart:
    _dir_suffix: ClassVar[str] = "/"
    """How directory entries of ``ls`` end: State/Filesystem backends keep our trailing ``/``,
    ``BaseSandbox`` omits it."""
    _window_newline: ClassVar[bool] = True
    """Whether a read window keeps its last line's newline: ``slice_read_response`` (ours too)
    does; ``BaseSandbox``'s read script strips each line's ending and rejoins the lines, so it
    does not."""

    def __init__(self, backend: p.BackendProtocol) -> None:
        self.backend = backend

    def _file_info(self, info: p.FileInfo) -> da.FileInfo:
        path = info.path.rstrip("/") + self._dir_suffix if info.is_dir and info.path != "/" else info.path
        converted: da.FileInfo = {"path": path, "is_dir": info.is_dir}
        if info.size is not None:
            converted["size"] = info.size
        if info.modified_at is not None:
            converted["modified_at"] = info.modified_at
        return converted

    # ------------------------------------------------------------------ conversions

    def _ls(self, result: p.LsResult) -> da.LsResult:
        if result.error is not None:
            message = _message(result) or result.error
            return da.LsResult(error=message if result.error in message else f"{message} ({result.error})")
        return da.LsResult(entries=[self._file_info(e) for e in result.entries or []])

    def _read(self, result: p.ReadResult) -> da.ReadResult:
        file_data = None if result.file_data is None else _file_data(result.file_data)
        if (
            file_data is not None
            and not self._window_newline
            and result.start_line is not None
            and file_data["content"].endswith("\n")
        ):
            file_data["content"] = file_data["content"][:-1]
        return da.ReadResult(
            error=_message(result),
            file_data=file_data,
            total_lines=result.total_lines,
            start_line=result.start_line,
            end_line=result.end_line,
            next_offset=result.next_offset,
            no_lines_requested=result.no_lines_requested,
        )

    @staticmethod
    def _grep(result: p.GrepResult) -> da.GrepResult:
        matches = None if result.matches is None else [_grep_match(m) for m in result.matches]
        return da.GrepResult(error=_message(result), matches=matches, truncated=result.truncated)

    def _glob(self, result: p.GlobResult) -> da.GlobResult:
        matches = None if result.matches is None else [self._file_info(m) for m in result.matches]
        # Our truncation never says why, and deepagents documents None as "cause unknown".
        return da.GlobResult(error=_message(result), matches=matches, truncated=result.truncated)

    @staticmethod
    def _uploads(responses: list[p.FileUploadResponse]) -> list[da.FileUploadResponse]:
        return [da.FileUploadResponse(path=r.path, error=_transfer_error(r.error)) for r in responses]

    @staticmethod
    def _downloads(responses: list[p.FileDownloadResponse]) -> list[da.FileDownloadResponse]:
        return [
            da.FileDownloadResponse(path=r.path, content=r.content, error=_transfer_error(r.error)) for r in responses
        ]

    # ------------------------------------------------------------------ sync

    def ls(self, path: str) -> da.LsResult:
        return self._ls(self.backend.ls(path))

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> da.ReadResult:
        return self._read(self.backend.read(file_path, offset, limit))

    def write(self, file_path: str, content: str) -> da.WriteResult:
        result = self.backend.write(file_path, content)
        return da.WriteResult(error=_message(result), path=result.path)

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> da.EditResult:
        result = self.backend.edit(file_path, old_string, new_string, replace_all)
        return da.EditResult(error=_message(result), path=result.path, occurrences=result.occurrences)

    def delete(self, file_path: str) -> da.DeleteResult:
        result = self.backend.delete(file_path)
        return da.DeleteResult(error=_message(result), path=result.path)

    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> da.GrepResult:
        return self._grep(self.backend.grep(pattern, path, glob, max_count=max_count))

    def glob(self, pattern: str, path: str | None = None) -> da.GlobResult:
        return self._glob(self.backend.glob(pattern, path))

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[da.FileUploadResponse]:
        return self._uploads(self.backend.upload_files(files))

    def download_files(self, paths: list[str]) -> list[da.FileDownloadResponse]:
        return self._downloads(self.backend.download_files(paths))

    # ------------------------------------------------------------------ async

    async def als(self, path: str) -> da.LsResult:
        return self._ls(await self.backend.als(path))

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> da.ReadResult:
        return self._read(await self.backend.aread(file_path, offset, limit))

    async def awrite(self, file_path: str, content: str) -> da.WriteResult:
        result = await self.backend.awrite(file_path, content)
        return da.WriteResult(error=_message(result), path=result.path)

    async def aedit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> da.EditResult:
        result = await self.backend.aedit(file_path, old_string, new_string, replace_all)
        return da.EditResult(error=_message(result), path=result.path, occurrences=result.occurrences)

    async def adelete(self, file_path: str) -> da.DeleteResult:
        result = await self.backend.adelete(file_path)
        return da.DeleteResult(error=_message(result), path=result.path)

    async def agrep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> da.GrepResult:
        return self._grep(await self.backend.agrep(pattern, path, glob, max_count=max_count))

    async def aglob(self, pattern: str, path: str | None = None) -> da.GlobResult:
        return self._glob(await self.backend.aglob(pattern, path))

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[da.FileUploadResponse]:
        return self._uploads(await self.backend.aupload_files(files))

    async def adownload_files(self, paths: list[str]) -> list[da.FileDownloadResponse]:
        return self._downloads(await self.backend.adownload_files(paths))


def _execute_response(response: p.ExecuteResponse) -> da.ExecuteResponse:
    """deepagents has no error field: the agent must learn why from ``output`` and the exit code."""
    if response.error is None:
        return da.ExecuteResponse(output=response.output, exit_code=response.exit_code, truncated=response.truncated)
    note = f"Error: {response.message or response.error}"
    output = f"{response.output.rstrip()}\n\n{note}" if response.output.strip() else note
    exit_code = TIMEOUT_EXIT_CODE if response.error == p.TIMEOUT else response.exit_code
    return da.ExecuteResponse(output=output, exit_code=exit_code, truncated=response.truncated)


class DeepAgentsSandbox(DeepAgentsBackend, da.SandboxBackendProtocol):
    """A deepagents sandbox over one of ours: file operations plus ``execute``."""

    _dir_suffix: ClassVar[str] = ""
    _window_newline: ClassVar[bool] = False

    def __init__(self, backend: p.SandboxBackendProtocol) -> None:
        super().__init__(backend)
        self.sandbox = backend

    @property
    def id(self) -> str:
        return self.sandbox.id

    def execute(self, command: str, *, timeout: int | None = None) -> da.ExecuteResponse:
        return _execute_response(self.sandbox.execute(command, timeout=timeout))

    async def aexecute(
        self,
        command: str,
        *,
        timeout: int | None = None,  # noqa: ASYNC109 - the sandbox's command timeout, not an asyncio one
    ) -> da.ExecuteResponse:
        return _execute_response(await self.sandbox.aexecute(command, timeout=timeout))


class _Fresh:
    """The default of ``artifacts``: a new `StateBackend` for each view."""


_FRESH: Final = _Fresh()


def with_artifacts(
    sandbox: p.SandboxBackendProtocol, artifacts: p.BackendProtocol | _Fresh | None = _FRESH
) -> p.SandboxBackendProtocol:
    """``sandbox`` with `ARTIFACT_DIRS` routed to ``artifacts`` (``None``: not routed)."""
    if artifacts is None:
        return sandbox
    store = StateBackend() if isinstance(artifacts, _Fresh) else artifacts
    return CompositeBackend.create(sandbox, dict.fromkeys(ARTIFACT_DIRS, store))


@overload
def to_deepagents(
    backend: p.SandboxBackendProtocol, *, artifacts: p.BackendProtocol | _Fresh | None = _FRESH
) -> DeepAgentsSandbox: ...
@overload
def to_deepagents(
    backend: p.BackendProtocol, *, artifacts: p.BackendProtocol | _Fresh | None = _FRESH
) -> DeepAgentsBackend: ...
def to_deepagents(
    backend: p.BackendProtocol, *, artifacts: p.BackendProtocol | _Fresh | None = _FRESH
) -> DeepAgentsBackend:
    """The deepagents view of ``backend``: a sandbox when it can run commands, its
    `ARTIFACT_DIRS` then routed to ``artifacts`` (by default a `StateBackend` of its own; ``None``
    leaves them on the sandbox's disk). Other backends are viewed as they are."""
    if isinstance(backend, p.SandboxBackendProtocol):
        return DeepAgentsSandbox(with_artifacts(backend, artifacts))
    return DeepAgentsBackend(backend)


__all__ = [
    "ARTIFACT_DIRS",
    "TIMEOUT_EXIT_CODE",
    "DeepAgentsBackend",
    "DeepAgentsSandbox",
    "to_deepagents",
    "with_artifacts",
]
