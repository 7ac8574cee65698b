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
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from sandboxes import _parse, _scripts
from sandboxes import protocol as p
from sandboxes._calls import (
    DOWNLOAD_DETAILS,
    GREP_OUTPUT_LIMIT,
    MAX_BATCH_DOWNLOAD_BYTES,
    MAX_DOWNLOAD_BYTES,
    MAX_READ_BYTES,
    OPERATION_ENV,
    READ_SCAN_BYTES,
    SEARCH_OUTPUT_LIMIT,
    WRITE_OUTPUT_LIMIT,
    Call,
    Operation,
    batch_failed,
    shared_refusals,
    staging_name,
    upload_response,
    write_call,
)
from sandboxes._capabilities import KillsTagged, MarksAhead
from sandboxes._operations import FileOperations
from sandboxes._output import OutputHook
from sandboxes.paths import InvalidPathError, normalize_path
from sandboxes.semantics import (
    download_share,
    message_for,
    refused_input,
)

__all__ = [
    "GREP_OUTPUT_LIMIT",
    "MAX_BATCH_DOWNLOAD_BYTES",
    "MAX_DOWNLOAD_BYTES",
    "MAX_READ_BYTES",
    "OPERATION_ENV",
    "READ_SCAN_BYTES",
    "SEARCH_OUTPUT_LIMIT",
    "WRITE_OUTPUT_LIMIT",
    "BaseSandbox",
    "Call",
    "KillsTagged",
    "MarksAhead",
    "Operation",
    "StreamingSandbox",
    "staging_name",
    "write_call",
]

R = TypeVar("R")


class BaseSandbox(FileOperations, p.SandboxBackendProtocol):
    """File operations over ``execute()``; subclasses provide ``id`` and ``execute``."""

    operation_timeout: float = 300.0
    """Seconds a single file operation may take inside the sandbox before it is killed."""

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

    def run_call(self, call: Call) -> p.ExecuteResponse:
        """One `Call` as this sandbox's own file operations run theirs: its native form through
        the exec helper where the transport has one and it answers, else its script."""
        return self._run_call(call)

    def _run_call(self, call: Call) -> p.ExecuteResponse:
        """One round trip; transports with retry policies (reconnecting SSH) override this."""
        if call.native is not None and self.native_file_ops and (answer := self._run_native(call)) is not None:
            return answer
        return self.execute(
            call.command,
            stdin=call.stdin,
            timeout=self.operation_timeout,
            output_limit=call.output_limit,
            env=OPERATION_ENV.get(),
        )

    async def _arun_call(self, call: Call) -> p.ExecuteResponse:
        if call.native is not None and self.native_file_ops:
            answer = await asyncio.to_thread(self._run_native, call)  # as `aexecute` runs `execute`
            if answer is not None:
                return answer
        return await self.aexecute(
            call.command,
            stdin=call.stdin,
            timeout=self.operation_timeout,
            output_limit=call.output_limit,
            env=OPERATION_ENV.get(),
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
            return self._drive(self._upload(files), batch_failed(files, p.FileUploadResponse))
        results = self._in_groups(
            files, bulk, lambda group: self._drive(self._upload(group), batch_failed(group, p.FileUploadResponse))
        )
        prepared = self._drive(
            self._prepare_bulk([files[i] for i in bulk]), batch_failed([files[i] for i in bulk], p.FileUploadResponse)
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
            results[i] = upload_response(files[i][0], code, path)
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

    max_batch_download_bytes: int = MAX_BATCH_DOWNLOAD_BYTES
    """What one ``download_files`` batch may hold in all: each file at most its share
    (`sandboxes.semantics.download_share`); a bigger one answers ``file_too_large``."""

    def download_files(self, paths: list[str]) -> list[p.FileDownloadResponse]:
        return self.download_files_within(paths, self.max_download_bytes)

    def download_files_within(self, paths: list[str], max_bytes: int) -> list[p.FileDownloadResponse]:
        """``download_files`` with a per-file bound of ``max_bytes`` (the service's, for its
        JSON answers), and of each file's share of `max_batch_download_bytes`: bigger files
        answer ``file_too_large``."""
        share = download_share(max_bytes, self.max_batch_download_bytes, len(paths))
        found = self._download_within(paths, share)
        return found if share == max_bytes else shared_refusals(found, share, len(paths))

    def _download_within(self, paths: list[str], max_bytes: int) -> list[p.FileDownloadResponse]:
        bulk = self._bulk_downloads(paths, max_bytes)
        threshold = self.bulk_threshold
        if not bulk or threshold is None:
            return self._drive(self._download(paths, max_bytes), batch_failed(paths, p.FileDownloadResponse))
        results = self._in_groups(
            paths,
            bulk,
            lambda group: self._drive(self._download(group, max_bytes), batch_failed(group, p.FileDownloadResponse)),
        )
        group = [paths[i] for i in bulk]
        inline = self._drive(self._download(group, threshold), batch_failed(group, p.FileDownloadResponse))
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
                responses[index] = upload_response(files[index][0], _parse.code_for_status(status), path)
        return [r for r in responses if r is not None]

    def _fetch_bulk(self, raw: str, max_bytes: int) -> p.FileDownloadResponse:
        path = normalize_path(raw)
        outcome = self._bulk_get(path, max_bytes)
        if isinstance(outcome, bytes):
            return p.FileDownloadResponse(raw, outcome)
        detail = f"larger than {max_bytes} bytes" if outcome == p.FILE_TOO_LARGE else DOWNLOAD_DETAILS.get(outcome)
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
        return await self._adrive(self._upload(files), batch_failed(files, p.FileUploadResponse))

    async def adownload_files(self, paths: list[str]) -> list[p.FileDownloadResponse]:
        """`download_files`: natively async inline; a file too big for the inline path is
        fetched through the bulk transport (which blocks) in a worker thread, as it would be
        synchronously. Each file is bounded by its share of `max_batch_download_bytes`."""
        max_bytes = download_share(self.max_download_bytes, self.max_batch_download_bytes, len(paths))
        found = await self._adownload_within(paths, max_bytes)
        return found if max_bytes == self.max_download_bytes else shared_refusals(found, max_bytes, len(paths))

    async def _adownload_within(self, paths: list[str], max_bytes: int) -> list[p.FileDownloadResponse]:
        bulk = self._bulk_downloads(paths, max_bytes)
        threshold = self.bulk_threshold
        if not bulk or threshold is None:
            return await self._adrive(self._download(paths, max_bytes), batch_failed(paths, p.FileDownloadResponse))
        chosen = set(bulk)
        rest = [i for i in range(len(paths)) if i not in chosen]
        results: dict[int, p.FileDownloadResponse] = {}
        for indices, limit in ((rest, max_bytes), (bulk, threshold)):
            group = [paths[i] for i in indices]
            if group:
                found = await self._adrive(self._download(group, limit), batch_failed(group, p.FileDownloadResponse))
                results.update(zip(indices, found, strict=True))
        for i in bulk:
            if results[i].error == p.FILE_TOO_LARGE:
                results[i] = await asyncio.to_thread(self._fetch_bulk, paths[i], max_bytes)
        return [results[i] for i in range(len(paths))]


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
