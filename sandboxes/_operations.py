"""The file operations of `sandboxes.base.BaseSandbox`, each a generator of round trips.

Each validates its arguments in Python, yields the `Call`s it needs (one constant script of
`sandboxes._scripts` with the arguments bound, and its native form) and turns the answers into
its result with `sandboxes.semantics`; it never runs anything itself, so the sync and async
drivers of `BaseSandbox` share it whole.
"""

from __future__ import annotations

import hashlib

from sandboxes import _parse, _scripts
from sandboxes import protocol as p
from sandboxes._calls import (
    DOWNLOAD_DETAILS,
    GREP_OUTPUT_LIMIT,
    MAX_READ_BYTES,
    READ_SCAN_BYTES,
    SEARCH_OUTPUT_LIMIT,
    WRITE_OUTPUT_LIMIT,
    Call,
    Operation,
    answer_room,
    join_or,
    token,
    upload_response,
    write_call,
    written_message,
)
from sandboxes.paths import InvalidPathError, normalize_path
from sandboxes.semantics import (
    EDIT_MAX_BYTES,
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

__all__ = ["FileOperations"]


class FileOperations:
    """The operations `BaseSandbox` drives: ls, read, write, edit, delete, glob, grep, and the
    inline upload and download, each an `Operation` that yields its calls and returns its result."""

    search_tools: bool = True
    """Whether ``grep`` may use ripgrep where the sandbox has it (one process instead of a walk
    and a search); ``False`` keeps to POSIX ``find`` and ``grep``, which every sandbox has."""

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
        response = yield Call(command, output_limit=answer_room(cap + 1), native=("read_file", *args))
        if (code := _parse.check(response, path)) is not None:
            detail = "not a regular file" if code == p.INVALID_ARGUMENT else None
            return code, message_for(code, path, detail)
        if response.truncated:
            raise _parse.ScriptFailed(p.BACKEND_ERROR, f"the sandbox sent more of '{path}' than {cap + 1} bytes")
        return _parse.file_bytes(response.output)

    def _fetch_whole(self, path: str, cap: int) -> Operation[bytes | tuple[p.ErrorCode, str]]:
        """The whole file (up to ``cap`` bytes), or why not."""
        data = yield from self._fetch(path, cap)
        if not isinstance(data, tuple) and len(data) > cap:
            return p.FILE_TOO_LARGE, message_for(p.FILE_TOO_LARGE, path, f"larger than {cap} bytes")
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
        response = yield Call(_scripts.command(_scripts.READ_LINES, *args), output_limit=answer_room(READ_SCAN_BYTES))
        if (code := _parse.check(response, path)) is not None:
            return p.ReadResult(code, message_for(code, path, DOWNLOAD_DETAILS.get(code)))
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
            return p.WriteResult(code, written_message(code, path))
        return p.WriteResult(path=path)

    def _edit(self, file_path: str, old: str, new: str, replace_all: bool) -> Operation[p.EditResult]:
        try:
            path = normalize_path(file_path)
        except InvalidPathError as exc:
            return p.EditResult(*refused_input(exc, file_path))
        data = yield from self._fetch_whole(path, EDIT_MAX_BYTES)
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
        args = (path, digest, str(len(replacement)), token())
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
        predicates = ["(", *join_or([["-name", n] for n in names]), ")"] if names else []
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
            responses[index] = upload_response(files[index][0], code, path)
        elif valid:
            args = [token(), *(arg for _, path, content in valid for arg in (path, str(len(content))))]
            stream = b"".join(content for _, _, content in valid)
            command = _scripts.command(_scripts.UPLOAD, *args)
            response = yield Call(command, stdin=stream, idempotent=False, native=("upload", *args))
            failure = _parse.check(response, valid[0][1])
            if failure is not None:  # the batch could not start (no temp space)
                statuses = [_scripts.EXIT_NO_SPACE if failure == p.NO_SPACE else _scripts.EXIT_PERMISSION] * len(valid)
            else:
                statuses = _parse.upload_statuses(response.output, len(valid))
            for (index, path, _), status in zip(valid, statuses, strict=True):
                responses[index] = upload_response(files[index][0], _parse.code_for_status(status), path)
        return [r for r in responses if r is not None]

    def _download(self, paths: list[str], limit: int) -> Operation[list[p.FileDownloadResponse]]:
        """Files in one round trip; larger ones than ``limit`` answer ``file_too_large`` without
        content (for a backend with a bulk transport to fetch separately, or refused), whether
        their size says so or what they held did (a pseudo-file says 0). What the sandbox sends
        is bounded by that limit per file, and more than it is never handed on."""
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
            room = len(valid) * (answer_room(limit) + 32)
            command = _scripts.command(_scripts.DOWNLOAD, *args)
            response = yield Call(command, output_limit=room, native=("download", *args))
            _parse.check(response, valid[0][1])
            if response.truncated:
                raise _parse.ScriptFailed(p.BACKEND_ERROR, f"the sandbox sent more than {limit} bytes a file")
            for (index, path), (status, content) in zip(
                valid, _parse.downloads(response.output, len(valid)), strict=True
            ):
                code = None if status == 0 else (_parse.code_for_status(status) or p.BACKEND_ERROR)
                if content is not None and len(content) > limit:  # more than the script sends: not kept
                    code, content = p.FILE_TOO_LARGE, None
                message = None if code is None else message_for(code, path, DOWNLOAD_DETAILS.get(code))
                if code == p.FILE_TOO_LARGE:
                    message = message_for(code, path, f"larger than {limit} bytes")
                responses[index] = p.FileDownloadResponse(paths[index], content, code, message)
        return [r for r in responses if r is not None]
