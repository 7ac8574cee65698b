"""`BaseSandbox`: every file operation on top of one primitive, ``execute()``.

A backend supplies ``execute()`` (and ``id``) and inherits ls, read, write, edit, delete, grep,
glob, upload and download, each in ONE round trip (edit: two, read then compare-and-swap).
Backends whose transport moves files faster (tar over the Docker API, SFTP) override
``upload_files``/``download_files`` only.

Each operation is split in three: validate arguments in Python, run one constant script from
`sandboxes._scripts` with the arguments bound as quoted positional parameters, and interpret
the exit status and output in Python with `sandboxes.semantics`, the same code the in-memory
backend uses. The sync and async variants share everything but the call to ``execute``.

Reads, writes, compare-and-swaps, downloads, searches, listings and deletes also carry a native
form (`Call.native`): a transport whose exec helper does them without a process
(`native_file_ops`, `_run_native`) answers that, with the script's exit codes and output, and
runs the script where the helper hands it back.
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import uuid
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from sandboxes import _parse, _scripts
from sandboxes import protocol as p
from sandboxes._output import UNLIMITED, OutputHook
from sandboxes.paths import InvalidPathError, normalize_path
from sandboxes.semantics import (
    InvalidGlobError,
    Replacement,
    basename_prefilter,
    compile_glob,
    filter_glob,
    finish_grep,
    lines_window,
    message_for,
    read_window,
    refused_input,
    replace_text,
    text_prefix,
)

R = TypeVar("R")

MAX_READ_BYTES = 256 << 20
"""``edit`` refuses files larger than this: they travel whole through ``execute`` (base64; raw
through the exec helper, 256 KiB a turn of its loop)."""

READ_SCAN_BYTES = 8 << 20
"""``read`` looks at most at this many of a file's first bytes: a bigger file answers a window
within its complete lines there, or ``file_too_large`` (`sandboxes.semantics.read_window`)."""

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


@runtime_checkable
class KillsTagged(Protocol):
    """A sandbox that can kill by environment marker WITHOUT starting a process in it: through
    a helper it already runs (the exec helper of Docker, SSH, Kubernetes and a local jail).

    Why a capability: a command that filled the sandbox's process limit (a fork bomb, a runaway
    job) leaves no room for the ``sh`` that `sandboxes._scripts.KILL_MARKED` needs, and killing
    it is exactly what is wanted then. Checked with ``isinstance``; without it, or when it
    answers ``False``, callers fall back to commands."""

    def kill_tagged(self, name: str, value: str) -> bool:
        """Kill every running command given ``name=value`` in its ``env`` (however it changed
        its environment since) and every process of the sandbox whose environment holds
        ``name=value``; whether that was done and none is left (``False``: no helper is running
        right now, or the kill did not finish)."""
        ...


@runtime_checkable
class MarksAhead(Protocol):
    """A sandbox whose exec helper can start a command's shell before the command comes, for a
    caller that marks each command with a value of its own (``SANDBOXES_EXEC_ID``, the service's
    kill token): the shell's environment, the marker in it, is fixed when it starts, so the
    marker must be known a command ahead. Checked with ``isinstance``; without it, any fresh
    value does, and the command starts cold."""

    def command_marker(self, new: Callable[[], str]) -> str:
        """The marker to give the caller's next command: one announced to the helper, or one
        from ``new`` (which makes unique values) when no helper runs or others are in flight.
        Only a speed-up: any marker works, and kills find the command by it either way
        (`sandboxes._mux.MuxClient.marker`)."""
        ...


# An operation is a generator that yields the `Call`s it needs, receives each response, and
# returns its result. `_drive` runs it over `execute`, `_adrive` over `aexecute`.
Operation = Generator[Call, p.ExecuteResponse, R]


class BaseSandbox(p.SandboxBackendProtocol):
    """File operations over ``execute()``; subclasses provide ``id`` and ``execute``."""

    operation_timeout: float = 300.0
    """Seconds a single file operation may take inside the sandbox before it is killed."""

    search_tools: bool = True
    """Whether ``grep`` may use ripgrep where the sandbox has it (one process instead of a walk
    and a search); ``False`` keeps to POSIX ``find`` and ``grep``, which every sandbox has."""

    def execute_streaming(
        self,
        command: str,
        on_output: OutputHook | None,
        *,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int | None = None,
    ) -> p.ExecuteResponse:
        """``execute``, also handing each chunk of output to ``on_output`` as it arrives, with
        the stream it came from (`sandboxes._output.OutputHook`), so a service can relay it
        live. ``on_output`` runs on a transport thread: it must neither block nor raise. This
        default, for transports without a live hook, hands over the (capped) output once,
        merged, when the command ends."""
        response = self.execute(command, timeout=timeout, stdin=stdin, env=env, cwd=cwd, output_limit=output_limit)
        if on_output is not None and response.output:
            on_output(response.output.encode("utf-8"))  # merged: the default stream
        return response

    native_file_ops: bool = False
    """Whether a `Call` with a ``native`` form goes to `_run_native` first: transports whose exec
    helper does writes itself (a frame round trip instead of four process starts) set it, and
    ``False`` on an instance forces the scripts (the conformance suite runs both paths)."""

    # ----------------------------------------------------------------- driving operations

    def _run_call(self, call: Call) -> p.ExecuteResponse:
        """One round trip; transports with retry policies (reconnecting SSH) override this."""
        if call.native is not None and self.native_file_ops and (answer := self._run_native(call)) is not None:
            return answer
        return self.execute(
            call.command, stdin=call.stdin, timeout=self.operation_timeout, output_limit=call.output_limit
        )

    async def _arun_call(self, call: Call) -> p.ExecuteResponse:
        if call.native is not None and self.native_file_ops:
            answer = await asyncio.to_thread(self._run_native, call)  # as `aexecute` runs `execute`
            if answer is not None:
                return answer
        return await self.aexecute(
            call.command, stdin=call.stdin, timeout=self.operation_timeout, output_limit=call.output_limit
        )

    def _run_native(self, call: Call) -> p.ExecuteResponse | None:
        """``call.native`` through the transport's live exec helper (`sandboxes._mux.client.
        run_native`, one frame round trip); ``None``: run ``call.command`` instead (no helper,
        or the helper handed it back), which the caller does on the same path."""
        return None

    def _drive(self, operation: Operation[R], on_error: Callable[[p.ErrorCode, str], R]) -> R:
        try:
            call = next(operation)
            while True:
                call = operation.send(self._run_call(call))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        except _parse.ScriptFailed as failed:
            return on_error(failed.code, failed.message)

    async def _adrive(self, operation: Operation[R], on_error: Callable[[p.ErrorCode, str], R]) -> R:
        try:
            call = next(operation)
            while True:
                call = operation.send(await self._arun_call(call))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        except _parse.ScriptFailed as failed:
            return on_error(failed.code, failed.message)

    # ----------------------------------------------------------------- operations

    def _ls(self, path: str) -> Operation[p.LsResult]:
        try:
            directory = normalize_path(path)
        except InvalidPathError as exc:
            return p.LsResult(*refused_input(exc, path))
        command = _scripts.command(_scripts.LS, directory)
        response = yield Call(command, output_limit=SEARCH_OUTPUT_LIMIT, native=("ls", directory))
        # `EXIT_LS_VANISHED` after a record is the exec'd stat's: the listing stands
        listed = response.error is None and "\0" in response.output
        vanished = listed and response.exit_code == _scripts.EXIT_LS_VANISHED
        if not vanished and (code := _parse.check(response, directory)) is not None:
            return p.LsResult(code, message_for(code, directory))
        return p.LsResult(entries=_parse.ls_entries(response.output, directory))

    def _fetch(self, path: str, cap: int = MAX_READ_BYTES) -> Operation[bytes | tuple[p.ErrorCode, str]]:
        """The file's first ``cap + 1`` bytes at most (a file of more: bigger than ``cap``), or
        why not. The sandbox is asked for no more, and no more is taken from it."""
        args = (path, str(cap + 1))
        command = _scripts.command(_scripts.READ_FILE, *args)
        response = yield Call(command, output_limit=_answer_room(cap + 1), native=("read_file", *args))
        if (code := _parse.check(response, path)) is not None:
            detail = "not a regular file" if code == p.INVALID_ARGUMENT else None
            return code, message_for(code, path, detail)
        if response.truncated:
            raise _parse.ScriptFailed(p.BACKEND_ERROR, f"the sandbox sent more of '{path}' than {cap + 1} bytes")
        return _parse.file_bytes(response.output)

    def _fetch_whole(self, path: str) -> Operation[bytes | tuple[p.ErrorCode, str]]:
        """The whole file (up to `MAX_READ_BYTES`), or why not."""
        data = yield from self._fetch(path)
        if not isinstance(data, tuple) and len(data) > MAX_READ_BYTES:
            return p.FILE_TOO_LARGE, message_for(
                p.FILE_TOO_LARGE, path, f"larger than {MAX_READ_BYTES} bytes; use download_files"
            )
        return data

    def _read(self, file_path: str, offset: int, limit: int) -> Operation[p.ReadResult]:
        try:
            path = normalize_path(file_path)
        except InvalidPathError as exc:
            return p.ReadResult(*refused_input(exc, file_path))
        data = yield from self._fetch(path, READ_SCAN_BYTES)
        if isinstance(data, tuple):
            return p.ReadResult(*data)
        if len(data) <= READ_SCAN_BYTES:
            return read_window(path, data, offset, limit)
        result = read_window(path, data, offset, limit, whole=False)  # one byte more: as good a prefix
        if result.error is None or limit <= 0 or text_prefix(path, data) is None:
            return result
        return (yield from self._read_lines(path, max(int(offset), 0), limit))

    def _read_lines(self, path: str, offset: int, limit: int) -> Operation[p.ReadResult]:
        """A window past what ``read`` looks at, cut in the sandbox (`_scripts.READ_LINES`)."""
        args = (path, str(offset + 1), str(limit), str(READ_SCAN_BYTES))
        response = yield Call(_scripts.command(_scripts.READ_LINES, *args), output_limit=_answer_room(READ_SCAN_BYTES))
        if (code := _parse.check(response, path)) is not None:
            return p.ReadResult(code, message_for(code, path, _DOWNLOAD_DETAILS.get(code)))
        first, _, encoded = response.output.partition("\n")
        total = _parse.natural(first.strip())
        if response.truncated or total is None:
            raise _parse.ScriptFailed(p.BACKEND_ERROR, f"the sandbox's window of '{path}' came back garbled")
        window = _parse.decode_base64(encoded)
        return lines_window(path, window, offset, total, cut=len(window) >= READ_SCAN_BYTES)

    def _write(self, file_path: str, content: str) -> Operation[p.WriteResult]:
        try:
            path = normalize_path(file_path)
        except InvalidPathError as exc:
            return p.WriteResult(*refused_input(exc, file_path))
        data = content.encode("utf-8")
        call = write_call(path, data)
        if (code := _parse.check((yield call), path)) is not None:
            return p.WriteResult(code, _written_message(code, path))
        return p.WriteResult(path=path)

    def _edit(self, file_path: str, old: str, new: str, replace_all: bool) -> Operation[p.EditResult]:
        try:
            path = normalize_path(file_path)
        except InvalidPathError as exc:
            return p.EditResult(*refused_input(exc, file_path))
        data = yield from self._fetch_whole(path)
        if isinstance(data, tuple):
            return p.EditResult(*data)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return p.EditResult(p.NOT_A_TEXT_FILE, message_for(p.NOT_A_TEXT_FILE, path))
        outcome = replace_text(path, text, old, new, replace_all)
        if not isinstance(outcome, Replacement):
            return p.EditResult(*outcome)
        digest = hashlib.md5(data, usedforsecurity=False).hexdigest()
        replacement = outcome.content.encode("utf-8")
        args = (path, digest, str(len(replacement)), _token())
        command = _scripts.command(_scripts.CAS_WRITE, *args)
        call = Call(command, replacement, WRITE_OUTPUT_LIMIT, idempotent=False, native=("cas_write", *args))
        if (code := _parse.check((yield call), path)) is not None:
            return p.EditResult(code, message_for(code, path))
        return p.EditResult(path=path, occurrences=outcome.occurrences)

    def _delete(self, file_path: str) -> Operation[p.DeleteResult]:
        try:
            path = normalize_path(file_path)
        except InvalidPathError as exc:
            return p.DeleteResult(*refused_input(exc, file_path))
        if path == "/":
            return p.DeleteResult(p.INVALID_PATH, "refusing to delete the root directory")
        call = Call(_scripts.command(_scripts.DELETE, path), idempotent=False, native=("delete", path))
        if (code := _parse.check((yield call), path)) is not None:
            return p.DeleteResult(code, message_for(code, path))
        return p.DeleteResult(path=path)

    def _find(self, root: str, pattern: str | None) -> Operation[list[str] | tuple[p.ErrorCode, str]]:
        """Regular files under ``root``, narrowed by ``pattern``'s basename where possible."""
        names = basename_prefilter(pattern) if pattern else None
        predicates = ["(", *_join_or([["-name", n] for n in names]), ")"] if names else []
        command = _scripts.command(_scripts.FIND_FILES, root, *predicates)
        call = Call(command, output_limit=SEARCH_OUTPUT_LIMIT, native=("find_files", root, *(names or [])))
        response = yield call
        if (code := _parse.check(response, root)) is not None:
            return code, message_for(code, root)
        return _parse.nul_list(response.output)

    def _glob(self, pattern: str, path: str | None) -> Operation[p.GlobResult]:
        try:
            root = normalize_path(path or "/")
            compile_glob(pattern)
        except (InvalidPathError, InvalidGlobError) as exc:
            return p.GlobResult(*refused_input(exc, path if isinstance(exc, InvalidPathError) else pattern))
        found = yield from self._find(root, pattern)
        if isinstance(found, tuple):
            return p.GlobResult(*found)
        return p.GlobResult(matches=[p.FileInfo(f) for f in filter_glob(found, pattern, root)])

    def _grep(self, pattern: str, path: str | None, glob: str | None, max_count: int | None) -> Operation[p.GrepResult]:
        try:
            root = normalize_path(path or "/")
            if glob:
                compile_glob(glob)
        except (InvalidPathError, InvalidGlobError) as exc:
            return p.GrepResult(*refused_input(exc, path if isinstance(exc, InvalidPathError) else glob))
        if "\n" in pattern:  # no line can contain it (grep -F would split it); only check the root
            found = yield from self._find(root, None)
            return p.GrepResult(*found) if isinstance(found, tuple) else p.GrepResult(matches=[])
        names = (basename_prefilter(glob) if glob else None) or []
        tool = "rg" if self.search_tools else "find"
        command = _scripts.command(_scripts.GREP, root, pattern, tool, *names)
        call = Call(command, output_limit=GREP_OUTPUT_LIMIT, native=("grep", root, pattern, *names))
        response = yield call
        if (code := _parse.check(response, root)) is not None:
            return p.GrepResult(code, message_for(code, root))
        matches, cut = _parse.parse_grep(response.output)
        if glob:
            keep = set(filter_glob({m.path for m in matches}, glob, root))
            matches = [m for m in matches if m.path in keep]
        result = finish_grep(matches, max_count)
        if (response.truncated or cut) and not result.truncated:
            return p.GrepResult(matches=result.matches, truncated=True)
        return result

    def _upload(self, files: list[tuple[str, bytes]]) -> Operation[list[p.FileUploadResponse]]:
        responses: list[p.FileUploadResponse | None] = []
        valid: list[tuple[int, str, bytes]] = []
        for index, (raw, content) in enumerate(files):
            try:
                valid.append((index, normalize_path(raw), content))
                responses.append(None)
            except InvalidPathError as exc:
                responses.append(p.FileUploadResponse(raw, *refused_input(exc, raw)))
        if len(valid) == 1:
            index, path, content = valid[0]
            response = yield write_call(path, content)
            code = _parse.check(response, path)
            responses[index] = _upload_response(files[index][0], code, path)
        elif valid:
            args = [_token(), *(arg for _, path, content in valid for arg in (path, str(len(content))))]
            stream = b"".join(content for _, _, content in valid)
            command = _scripts.command(_scripts.UPLOAD, *args)
            response = yield Call(command, stdin=stream, idempotent=False, native=("upload", *args))
            failure = _parse.check(response, valid[0][1])
            if failure is not None:  # the batch could not start (no temp space)
                statuses = [_scripts.EXIT_NO_SPACE if failure == p.NO_SPACE else _scripts.EXIT_PERMISSION] * len(valid)
            else:
                statuses = _parse.upload_statuses(response.output, len(valid))
            for (index, path, _), status in zip(valid, statuses, strict=True):
                responses[index] = _upload_response(files[index][0], _parse.code_for_status(status), path)
        return [r for r in responses if r is not None]

    def _download(self, paths: list[str], limit: int) -> Operation[list[p.FileDownloadResponse]]:
        """Files in one round trip; larger ones than ``limit`` answer ``file_too_large`` without
        content (for a backend with a bulk transport to fetch separately, or refused). What the
        sandbox sends is bounded by that limit per file."""
        responses: list[p.FileDownloadResponse | None] = []
        valid: list[tuple[int, str]] = []
        for index, raw in enumerate(paths):
            try:
                valid.append((index, normalize_path(raw)))
                responses.append(None)
            except InvalidPathError as exc:
                responses.append(p.FileDownloadResponse(raw, None, *refused_input(exc, raw)))
        if valid:
            args = (str(limit), *(path for _, path in valid))
            room = len(valid) * (_answer_room(limit) + 32)
            command = _scripts.command(_scripts.DOWNLOAD, *args)
            response = yield Call(command, output_limit=room, native=("download", *args))
            _parse.check(response, valid[0][1])
            if response.truncated:
                raise _parse.ScriptFailed(p.BACKEND_ERROR, f"the sandbox sent more than {limit} bytes a file")
            for (index, path), (status, content) in zip(
                valid, _parse.downloads(response.output, len(valid)), strict=True
            ):
                code = None if status == 0 else (_parse.code_for_status(status) or p.BACKEND_ERROR)
                message = None if code is None else message_for(code, path, _DOWNLOAD_DETAILS.get(code))
                if code == p.FILE_TOO_LARGE:
                    message = message_for(code, path, f"larger than {limit} bytes")
                responses[index] = p.FileDownloadResponse(paths[index], content, code, message)
        return [r for r in responses if r is not None]

    # ----------------------------------------------------------------- public sync API

    def ls(self, path: str) -> p.LsResult:
        return self._drive(self._ls(path), p.LsResult)

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> p.ReadResult:
        return self._drive(self._read(file_path, offset, limit), p.ReadResult)

    def write(self, file_path: str, content: str) -> p.WriteResult:
        return self._drive(self._write(file_path, content), p.WriteResult)

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> p.EditResult:
        return self._drive(self._edit(file_path, old_string, new_string, replace_all), p.EditResult)

    def delete(self, file_path: str) -> p.DeleteResult:
        return self._drive(self._delete(file_path), p.DeleteResult)

    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> p.GrepResult:
        return self._drive(self._grep(pattern, path, glob, max_count), p.GrepResult)

    def glob(self, pattern: str, path: str | None = None) -> p.GlobResult:
        return self._drive(self._glob(pattern, path), p.GlobResult)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[p.FileUploadResponse]:
        bulk = self._bulk_uploads(files)
        if not bulk:
            return self._drive(self._upload(files), _batch_failed(files, p.FileUploadResponse))
        results = self._in_groups(
            files, bulk, lambda group: self._drive(self._upload(group), _batch_failed(group, p.FileUploadResponse))
        )
        prepared = self._drive(
            self._prepare_bulk([files[i] for i in bulk]), _batch_failed([files[i] for i in bulk], p.FileUploadResponse)
        )
        ready = [
            (i, normalize_path(files[i][0]), files[i][1])
            for i, r in zip(bulk, prepared, strict=True)
            if r.error is None
        ]
        outcomes = self._put_staged([(path, data) for _, path, data in ready]) if ready else []
        for i, response in zip(bulk, prepared, strict=True):
            results[i] = response
        for (i, path, _), code in zip(ready, outcomes, strict=True):
            results[i] = _upload_response(files[i][0], code, path)
        return [results[i] for i in range(len(files))]

    def _put_staged(self, files: list[tuple[str, bytes]]) -> list[p.ErrorCode | None]:
        """`_bulk_put` each file under a temporary name beside its target, then rename them all
        into place in one round trip: a bulk transfer cut halfway (a killed client, a dropped
        connection) leaves every target as it was, as the inline path does."""
        staged = [(staging_name(path), data) for path, data in files]
        outcomes = self._bulk_put(staged)
        args: list[str] = []
        for (target, data), (temp, _), code in zip(files, staged, outcomes, strict=True):
            args += [temp, target, "-" if code is not None else str(len(data))]
        committed = [i for i, code in enumerate(outcomes) if code is None]
        try:
            response = self._run_call(Call(_scripts.command(_scripts.COMMIT_STAGED, *args), idempotent=False))
            failure = _parse.check(response, files[0][0])
            statuses = None if failure is not None else _parse.upload_statuses(response.output, len(committed))
        except _parse.ScriptFailed as exc:
            failure, statuses = exc.code, None
        result = list(outcomes)
        for position, i in enumerate(committed):
            result[i] = failure if statuses is None else _parse.code_for_status(statuses[position])
        return result

    max_download_bytes: int = MAX_DOWNLOAD_BYTES
    """Per-file bound of ``download_files``: a bigger file (by its size, or by what it turned
    out to hold) answers ``file_too_large``, and no more of it is taken from the sandbox."""

    def download_files(self, paths: list[str]) -> list[p.FileDownloadResponse]:
        return self.download_files_within(paths, self.max_download_bytes)

    def download_files_within(self, paths: list[str], max_bytes: int) -> list[p.FileDownloadResponse]:
        """``download_files`` with a per-file bound of ``max_bytes`` (the service's, for its
        JSON answers): bigger files answer ``file_too_large``."""
        bulk = self._bulk_downloads(paths, max_bytes)
        threshold = self.bulk_threshold
        if not bulk or threshold is None:
            return self._drive(self._download(paths, max_bytes), _batch_failed(paths, p.FileDownloadResponse))
        results = self._in_groups(
            paths,
            bulk,
            lambda group: self._drive(self._download(group, max_bytes), _batch_failed(group, p.FileDownloadResponse)),
        )
        group = [paths[i] for i in bulk]
        inline = self._drive(self._download(group, threshold), _batch_failed(group, p.FileDownloadResponse))
        for i, response in zip(bulk, inline, strict=True):
            results[i] = self._fetch_bulk(paths[i], max_bytes) if response.error == p.FILE_TOO_LARGE else response
        return [results[i] for i in range(len(paths))]

    # ----------------------------------------------------------------- bulk transfer hooks

    bulk_threshold: int | None = None
    """Files above this many bytes move through `_bulk_put`/`_bulk_get` (tar, SFTP) instead of
    inline through ``execute``; ``None`` disables the bulk path."""

    def _bulk_eligible(self, path: str, size: int | None) -> bool:
        """Whether ``path`` may use the bulk transport; ``size`` is ``None`` for downloads
        (whose size is only learnt inside the sandbox)."""
        return self.bulk_threshold is not None and (size is None or size > self.bulk_threshold)

    def _bulk_uploads(self, files: list[tuple[str, bytes]]) -> list[int]:
        """Indices of the files of an upload that take the bulk transport."""
        return [i for i, (path, data) in enumerate(files) if self._bulk_eligible(path, len(data))]

    def _bulk_downloads(self, paths: list[str], max_bytes: int) -> list[int]:
        """Indices of the paths of a download that may take the bulk transport: none when the
        bound ``max_bytes`` is within what the inline path carries."""
        threshold = self.bulk_threshold
        if threshold is None or max_bytes <= threshold:
            return []
        return [i for i, path in enumerate(paths) if self._bulk_eligible(path, None)]

    def _bulk_put(self, files: list[tuple[str, bytes]]) -> list[p.ErrorCode | None]:
        """Write files whose destinations `_prepare_bulk` already checked and created parents for."""
        raise NotImplementedError

    def _bulk_get(self, path: str, max_bytes: int) -> bytes | p.ErrorCode:
        """The file's bytes, or ``file_too_large`` past ``max_bytes`` (counted as they arrive)."""
        raise NotImplementedError

    def _prepare_bulk(self, files: list[tuple[str, bytes]]) -> Operation[list[p.FileUploadResponse]]:
        """One round trip: validate every bulk destination, create its parents, say which may be written."""
        responses: list[p.FileUploadResponse | None] = []
        valid: list[tuple[int, str]] = []
        for index, (raw, _) in enumerate(files):
            try:
                valid.append((index, normalize_path(raw)))
                responses.append(None)
            except InvalidPathError as exc:
                responses.append(p.FileUploadResponse(raw, *refused_input(exc, raw)))
        if valid:
            call = Call(_scripts.command(_scripts.PREPARE_UPLOAD, *(path for _, path in valid)), idempotent=False)
            response = yield call
            _parse.check(response, valid[0][1])
            for (index, path), status in zip(valid, _parse.upload_statuses(response.output, len(valid)), strict=True):
                responses[index] = _upload_response(files[index][0], _parse.code_for_status(status), path)
        return [r for r in responses if r is not None]

    def _fetch_bulk(self, raw: str, max_bytes: int) -> p.FileDownloadResponse:
        path = normalize_path(raw)
        outcome = self._bulk_get(path, max_bytes)
        if isinstance(outcome, bytes):
            return p.FileDownloadResponse(raw, outcome)
        detail = f"larger than {max_bytes} bytes" if outcome == p.FILE_TOO_LARGE else _DOWNLOAD_DETAILS.get(outcome)
        return p.FileDownloadResponse(raw, None, outcome, message_for(outcome, path, detail))

    @staticmethod
    def _in_groups(items: list[Any], bulk: list[int], inline: Callable[[list[Any]], list[Any]]) -> dict[int, Any]:
        """Run ``inline`` over the items not in ``bulk`` (one batch), keyed by original index."""
        chosen = set(bulk)
        rest = [i for i in range(len(items)) if i not in chosen]
        if not rest:
            return {}
        return dict(zip(rest, inline([items[i] for i in rest]), strict=True))

    # ----------------------------------------------------------------- public async API

    async def als(self, path: str) -> p.LsResult:
        return await self._adrive(self._ls(path), p.LsResult)

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> p.ReadResult:
        return await self._adrive(self._read(file_path, offset, limit), p.ReadResult)

    async def awrite(self, file_path: str, content: str) -> p.WriteResult:
        return await self._adrive(self._write(file_path, content), p.WriteResult)

    async def aedit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> p.EditResult:
        return await self._adrive(self._edit(file_path, old_string, new_string, replace_all), p.EditResult)

    async def adelete(self, file_path: str) -> p.DeleteResult:
        return await self._adrive(self._delete(file_path), p.DeleteResult)

    async def agrep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> p.GrepResult:
        return await self._adrive(self._grep(pattern, path, glob, max_count), p.GrepResult)

    async def aglob(self, pattern: str, path: str | None = None) -> p.GlobResult:
        return await self._adrive(self._glob(pattern, path), p.GlobResult)

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[p.FileUploadResponse]:
        """`upload_files`: natively async inline; a batch with a file for the bulk transport
        (which blocks) takes `upload_files` itself, in a worker thread."""
        if self._bulk_uploads(files):
            return await asyncio.to_thread(self.upload_files, files)
        return await self._adrive(self._upload(files), _batch_failed(files, p.FileUploadResponse))

    async def adownload_files(self, paths: list[str]) -> list[p.FileDownloadResponse]:
        """`download_files`: natively async inline; a file too big for the inline path is
        fetched through the bulk transport (which blocks) in a worker thread, as it would be
        synchronously."""
        max_bytes = self.max_download_bytes
        bulk = self._bulk_downloads(paths, max_bytes)
        threshold = self.bulk_threshold
        if not bulk or threshold is None:
            return await self._adrive(self._download(paths, max_bytes), _batch_failed(paths, p.FileDownloadResponse))
        chosen = set(bulk)
        rest = [i for i in range(len(paths)) if i not in chosen]
        results: dict[int, p.FileDownloadResponse] = {}
        for indices, limit in ((rest, max_bytes), (bulk, threshold)):
            group = [paths[i] for i in indices]
            if group:
                found = await self._adrive(self._download(group, limit), _batch_failed(group, p.FileDownloadResponse))
                results.update(zip(indices, found, strict=True))
        for i in bulk:
            if results[i].error == p.FILE_TOO_LARGE:
                results[i] = await asyncio.to_thread(self._fetch_bulk, paths[i], max_bytes)
        return [results[i] for i in range(len(paths))]


_DOWNLOAD_DETAILS: dict[p.ErrorCode, str] = {
    p.INVALID_ARGUMENT: "not a regular file (a FIFO, a device, or a file under /proc, /sys or /dev)",
}


def _answer_room(size: int) -> int:
    """Room for a file op's answer of ``size`` bytes of a file: raw, or as base64 lines (76
    characters and a newline for every 57 bytes), with a little for its framing."""
    return (size + 2) // 3 * 4 + size // 57 + 4096


def _join_or(groups: list[list[str]]) -> list[str]:
    joined: list[str] = []
    for group in groups:
        if joined:
            joined.append("-o")
        joined.extend(group)
    return joined


def write_call(path: str, data: bytes) -> Call:
    """`_scripts.WRITE` of ``data`` to ``path``, with its native form."""
    args = (path, str(len(data)), _token())
    command = _scripts.command(_scripts.WRITE, *args)
    return Call(command, data, WRITE_OUTPUT_LIMIT, idempotent=False, native=("write", *args))


def _token() -> str:
    """Random enough that two writers never pick the same staging name beside one file."""
    return uuid.uuid4().hex[:16]


def staging_name(path: str) -> str:
    """A fresh hidden name beside ``path`` for a bulk transfer to fill before it is renamed over
    ``path`` (beside it, so the rename never crosses a filesystem)."""
    directory = path.rpartition("/")[0]
    return f"{directory}/.sandboxes-write.{_token()}"


def _upload_response(raw: str, code: p.ErrorCode | None, path: str) -> p.FileUploadResponse:
    if code is None:
        return p.FileUploadResponse(raw)
    return p.FileUploadResponse(raw, code, _written_message(code, path))


def _written_message(code: p.ErrorCode, path: str) -> str:
    """The sentence for a write's error: ``invalid_argument`` is always a special file refused."""
    if code == p.INVALID_ARGUMENT:
        return message_for(code, path, "not a regular file (a FIFO, device or socket); only regular files are written")
    return message_for(code, path)


def _batch_failed(items: list[Any], kind: type[Any]) -> Callable[[p.ErrorCode, str], list[Any]]:
    """When a whole batch round trip fails, every item reports it, in order; nothing raises."""

    def report(code: p.ErrorCode, message: str) -> list[Any]:
        return [kind(item[0] if isinstance(item, tuple) else item, error=code, message=message) for item in items]

    return report


class StreamingSandbox(BaseSandbox):
    """A sandbox whose transport sees output as it arrives: it implements `execute_streaming`,
    and ``execute`` is that without a listener."""

    def execute(
        self,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int | None = None,
    ) -> p.ExecuteResponse:
        return self.execute_streaming(
            command, None, timeout=timeout, stdin=stdin, env=env, cwd=cwd, output_limit=output_limit
        )

    @abc.abstractmethod
    def execute_streaming(
        self,
        command: str,
        on_output: OutputHook | None,
        *,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int | None = None,
    ) -> p.ExecuteResponse: ...
