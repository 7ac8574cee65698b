"""`StateBackend`: an ephemeral, in-memory filesystem.

It models a real filesystem closely enough that any sandbox can be checked against it
operation by operation (the differential conformance test): directories exist explicitly
(created by writes, like ``mkdir -p``, and surviving the deletion of their last file), a file
cannot sit where a directory is expected, and every answer comes from the same
`sandboxes.semantics` code the sandboxes use.

Files are `FileData` values (text as-is, binary as base64) held in a plain dict, so the state
can be handed to and taken back from a LangGraph graph (``files`` / `from_files`).
"""

from __future__ import annotations

import base64
import threading
import uuid
from collections.abc import Iterator, Mapping

from sandboxes import protocol as p
from sandboxes.paths import InvalidPathError, is_within, normalize_path, parent
from sandboxes.semantics import (
    EDIT_MAX_BYTES,
    InvalidGlobError,
    Replacement,
    compile_glob,
    decode_text,
    failure,
    filter_glob,
    finish_grep,
    grep_text,
    now_iso,
    read_window,
    refused_input,
    replace_text,
)


def _ancestors(path: str) -> Iterator[str]:
    while path != "/":
        path = parent(path)
        yield path


class StateBackend(p.BackendProtocol):
    """Thread-safe; every operation is atomic with respect to the others."""

    def __init__(self, files: Mapping[str, p.FileData] | None = None) -> None:
        self.id = f"state-{uuid.uuid4().hex[:12]}"
        self._files: dict[str, p.FileData] = {}
        self._dirs: set[str] = {"/"}
        self._lock = threading.RLock()
        for path, data in (files or {}).items():
            self._put(normalize_path(path), data)

    @property
    def files(self) -> dict[str, p.FileData]:
        """A snapshot of every file, by path."""
        with self._lock:
            return dict(self._files)

    # ------------------------------------------------------------------ internals

    def _put(self, path: str, data: p.FileData) -> None:
        self._dirs.update(_ancestors(path))
        self._files[path] = data

    def _blocked(self, path: str) -> tuple[p.ErrorCode, str] | None:
        """Why a file could not be created at ``path``: it is a directory, or a parent is a file."""
        if path in self._dirs:
            return failure(p.IS_DIRECTORY, path)
        if any(a in self._files for a in _ancestors(path)):
            return failure(p.NOT_A_DIRECTORY, path)
        return None

    def _missing(self, path: str) -> tuple[p.ErrorCode, str]:
        if path in self._dirs:
            return failure(p.IS_DIRECTORY, path)
        if any(a in self._files for a in _ancestors(path)):
            return failure(p.NOT_A_DIRECTORY, path)
        return failure(p.FILE_NOT_FOUND, path)

    @staticmethod
    def _bytes(data: p.FileData) -> bytes:
        return base64.b64decode(data.content) if data.encoding == "base64" else data.content.encode("utf-8")

    def _store(self, path: str, content: bytes) -> None:
        text = decode_text("", content)
        if text is None:
            text, encoding = base64.b64encode(content).decode("ascii"), "base64"
        else:
            encoding = "utf-8"
        old = self._files.get(path)
        stamp = now_iso()
        created = old.created_at if old is not None else stamp
        self._put(path, p.FileData(text, encoding, created, stamp))  # type: ignore[arg-type]

    def _under(self, root: str) -> list[str]:
        return [f for f in self._files if is_within(f, root)]

    # ------------------------------------------------------------------ protocol

    def ls(self, path: str) -> p.LsResult:
        try:
            directory = normalize_path(path)
        except InvalidPathError as exc:
            return p.LsResult(*refused_input(exc, path))
        with self._lock:
            if directory in self._files:
                return p.LsResult(*failure(p.NOT_A_DIRECTORY, directory))
            if directory not in self._dirs:
                return p.LsResult(*self._missing(directory))
            prefix = directory.rstrip("/") + "/"
            entries = [
                p.FileInfo(f, False, len(self._bytes(d)), d.modified_at)
                for f, d in self._files.items()
                if f.startswith(prefix) and "/" not in f[len(prefix) :]
            ]
            entries += [
                p.FileInfo(d + "/", True, 0, None)
                for d in self._dirs
                if d != directory and d.startswith(prefix) and "/" not in d[len(prefix) :]
            ]
        return p.LsResult(entries=sorted(entries, key=lambda e: e.path))

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> p.ReadResult:
        try:
            path = normalize_path(file_path)
        except InvalidPathError as exc:
            return p.ReadResult(*refused_input(exc, file_path))
        with self._lock:
            data = self._files.get(path)
            if data is None:
                return p.ReadResult(*self._missing(path))
        return read_window(
            path, self._bytes(data), offset, limit, created_at=data.created_at, modified_at=data.modified_at
        )

    def write(self, file_path: str, content: str) -> p.WriteResult:
        try:
            path = normalize_path(file_path)
        except InvalidPathError as exc:
            return p.WriteResult(*refused_input(exc, file_path))
        with self._lock:
            if (blocked := self._blocked(path)) is not None:
                return p.WriteResult(*blocked)
            self._store(path, content.encode("utf-8"))
        return p.WriteResult(path=path)

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> p.EditResult:
        try:
            path = normalize_path(file_path)
        except InvalidPathError as exc:
            return p.EditResult(*refused_input(exc, file_path))
        with self._lock:
            data = self._files.get(path)
            if data is None:
                return p.EditResult(*self._missing(path))
            raw = self._bytes(data)
            if len(raw) > EDIT_MAX_BYTES:
                return p.EditResult(*failure(p.FILE_TOO_LARGE, path, f"larger than {EDIT_MAX_BYTES} bytes"))
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                return p.EditResult(*failure(p.NOT_A_TEXT_FILE, path))
            outcome = replace_text(path, text, old_string, new_string, replace_all)
            if not isinstance(outcome, Replacement):
                return p.EditResult(*outcome)
            self._store(path, outcome.content.encode("utf-8"))
        return p.EditResult(path=path, occurrences=outcome.occurrences)

    def delete(self, file_path: str) -> p.DeleteResult:
        try:
            path = normalize_path(file_path)
        except InvalidPathError as exc:
            return p.DeleteResult(*refused_input(exc, file_path))
        if path == "/":
            return p.DeleteResult(p.INVALID_PATH, "refusing to delete the root directory")
        with self._lock:
            if path not in self._files and path not in self._dirs:
                return p.DeleteResult(*self._missing(path))
            for f in self._under(path):
                del self._files[f]
            self._dirs = {d for d in self._dirs if not is_within(d, path)}
        return p.DeleteResult(path=path)

    def _search_root(self, path: str | None) -> str | tuple[p.ErrorCode, str]:
        try:
            root = normalize_path(path or "/")
        except InvalidPathError as exc:
            return refused_input(exc, path)
        if root not in self._files and root not in self._dirs:
            return self._missing(root)
        return root

    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> p.GrepResult:
        try:
            if glob:
                compile_glob(glob)
        except InvalidGlobError as exc:
            return p.GrepResult(*refused_input(exc, glob))
        with self._lock:
            root = self._search_root(path)
            if isinstance(root, tuple):
                return p.GrepResult(*root)
            candidates = self._under(root)
            if glob:
                candidates = filter_glob(candidates, glob, root)
            matches: list[p.GrepMatch] = []
            for f in candidates:
                text = decode_text("", self._bytes(self._files[f]))
                if text is not None:
                    matches.extend(grep_text(f, text, pattern))
        return finish_grep(matches, max_count)

    def glob(self, pattern: str, path: str | None = None) -> p.GlobResult:
        try:
            compile_glob(pattern)
        except InvalidGlobError as exc:
            return p.GlobResult(*refused_input(exc, pattern))
        with self._lock:
            root = self._search_root(path)
            if isinstance(root, tuple):
                return p.GlobResult(*root)
            found = filter_glob(self._under(root), pattern, root)
        return p.GlobResult(matches=[p.FileInfo(f) for f in found])

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[p.FileUploadResponse]:
        responses = []
        with self._lock:
            for raw, content in files:
                try:
                    path = normalize_path(raw)
                except InvalidPathError as exc:
                    responses.append(p.FileUploadResponse(raw, *refused_input(exc, raw)))
                    continue
                if (blocked := self._blocked(path)) is not None:
                    responses.append(p.FileUploadResponse(raw, *blocked))
                    continue
                self._store(path, bytes(content))
                responses.append(p.FileUploadResponse(raw))
        return responses

    def download_files(self, paths: list[str]) -> list[p.FileDownloadResponse]:
        responses = []
        with self._lock:
            for raw in paths:
                try:
                    path = normalize_path(raw)
                except InvalidPathError as exc:
                    responses.append(p.FileDownloadResponse(raw, None, *refused_input(exc, raw)))
                    continue
                data = self._files.get(path)
                if data is None:
                    responses.append(p.FileDownloadResponse(raw, None, *self._missing(path)))
                else:
                    responses.append(p.FileDownloadResponse(raw, self._bytes(data)))
        return responses
