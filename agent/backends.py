"""Backends that keep files in LangGraph rather than in a sandbox.

* `GraphStateBackend`: files in the graph state (the ``files`` channel, merged by
  `merge_files`), so they are checkpointed with the thread and die with it. It is the
  ``/scratch/`` route of the default layout.
* `StoreBackend`: files as items of a LangGraph `BaseStore` namespace, so they outlive threads
  (the ``/memories/`` route).

Both answer every operation with `sandboxes.state.StateBackend`, the reference implementation
every sandbox is tested against, loaded lazily from a snapshot; they differ only in where the
snapshot comes from and where changes go. So ``/scratch/`` and ``/memories/`` behave exactly
like a sandbox's disk (errors, pagination, grep and glob rules). Directories are implied by
files: an empty directory is not kept.

A graph node cannot write its state directly; it returns updates. So `GraphStateBackend`
records what changed (`changes`), and the tool returns it as a ``files`` update. The store is
written through at once.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Mapping
from typing import Any, TypedDict

from langgraph.store.base import BaseStore

from sandboxes import protocol as p
from sandboxes.state import StateBackend

__all__ = ["FileRecord", "GraphStateBackend", "StoreBackend", "merge_files"]

_STORE_PAGE = 500


class FileRecord(TypedDict):
    """A file as kept in graph state or a store: JSON-safe, so any checkpointer can save it."""

    content: str
    encoding: str
    created_at: str | None
    modified_at: str | None


def merge_files(
    left: Mapping[str, FileRecord] | None, right: Mapping[str, FileRecord | None] | None
) -> dict[str, FileRecord]:
    """Reducer of the ``files`` channel: ``right`` overrides ``left`` path by path, ``None`` deletes.

    Parallel tool calls each return only the paths they changed, so their updates merge.
    """
    merged = dict(left or {})
    for path, record in (right or {}).items():
        if record is None:
            merged.pop(path, None)
        else:
            merged[path] = record
    return merged


def to_record(data: p.FileData) -> FileRecord:
    return FileRecord(
        content=data.content, encoding=data.encoding, created_at=data.created_at, modified_at=data.modified_at
    )


def from_record(record: Mapping[str, Any]) -> p.FileData:
    encoding: p.Encoding = "base64" if record.get("encoding") == "base64" else "utf-8"
    return p.FileData(str(record["content"]), encoding, record.get("created_at"), record.get("modified_at"))


class _SnapshotBackend(p.BackendProtocol):
    """Every operation on a `StateBackend` loaded on first use; `_saved` runs after each change."""

    def __init__(self) -> None:
        self._inner: StateBackend | None = None
        self._loaded: dict[str, p.FileData] = {}
        self._lock = threading.RLock()

    @abc.abstractmethod
    def _load(self) -> dict[str, p.FileData]: ...

    def _saved(self) -> None:
        """Called after every operation that may have changed files."""

    def _state(self) -> StateBackend:
        with self._lock:
            if self._inner is None:
                self._loaded = self._load()
                self._inner = StateBackend(self._loaded)
            return self._inner

    def _diff(self) -> dict[str, p.FileData | None]:
        """What changed since the last load or save."""
        now = self._state().files
        diff: dict[str, p.FileData | None] = {k: v for k, v in now.items() if self._loaded.get(k) != v}
        diff.update({k: None for k in self._loaded if k not in now})
        return diff

    def ls(self, path: str) -> p.LsResult:
        return self._state().ls(path)

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> p.ReadResult:
        return self._state().read(file_path, offset, limit)

    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> p.GrepResult:
        return self._state().grep(pattern, path, glob, max_count=max_count)

    def glob(self, pattern: str, path: str | None = None) -> p.GlobResult:
        return self._state().glob(pattern, path)

    def download_files(self, paths: list[str]) -> list[p.FileDownloadResponse]:
        return self._state().download_files(paths)

    def write(self, file_path: str, content: str) -> p.WriteResult:
        with self._lock:
            result = self._state().write(file_path, content)
            self._saved()
        return result

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> p.EditResult:
        with self._lock:
            result = self._state().edit(file_path, old_string, new_string, replace_all)
            self._saved()
        return result

    def delete(self, file_path: str) -> p.DeleteResult:
        with self._lock:
            result = self._state().delete(file_path)
            self._saved()
        return result

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[p.FileUploadResponse]:
        with self._lock:
            result = self._state().upload_files(files)
            self._saved()
        return result


class GraphStateBackend(_SnapshotBackend):
    """Files of one thread's graph state. Changes are collected by `changes` for a state update."""

    def __init__(self, files: Mapping[str, FileRecord] | None, prefix: str = "/") -> None:
        """``files`` are keyed by the caller's paths: those under ``prefix`` (where the backend is
        mounted) are this backend's, seen without the prefix, as a routed backend sees paths."""
        super().__init__()
        self.prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
        self._records = dict(files or {})

    def _load(self) -> dict[str, p.FileData]:
        start = self.prefix + "/"
        return {
            path[len(self.prefix) :]: from_record(record)
            for path, record in self._records.items()
            if path.startswith(start)
        }

    def changes(self) -> dict[str, FileRecord | None]:
        """The ``files`` update (keyed by the caller's paths) that brings the state to this content."""
        if self._inner is None:
            return {}
        return {self.prefix + path: None if data is None else to_record(data) for path, data in self._diff().items()}


class StoreBackend(_SnapshotBackend):
    """Files as items of one `BaseStore` namespace (key: the path; value: a `FileRecord`).

    Written through: each change is put into the store before the operation returns. Two
    threads changing *different* files never interfere; two changing the same file at once:
    the last write wins, as with any shared disk.
    """

    def __init__(self, store: BaseStore, namespace: tuple[str, ...] = ("sandboxes-agent", "files")) -> None:
        super().__init__()
        self.store = store
        self.namespace = namespace

    def _load(self) -> dict[str, p.FileData]:
        files: dict[str, p.FileData] = {}
        offset = 0
        while True:
            page = self.store.search(self.namespace, limit=_STORE_PAGE, offset=offset)
            for item in page:
                if tuple(item.namespace) == self.namespace and "content" in item.value:
                    files[item.key] = from_record(item.value)
            if len(page) < _STORE_PAGE:
                return files
            offset += len(page)

    def _saved(self) -> None:
        for path, data in self._diff().items():
            if data is None:
                self.store.delete(self.namespace, path)
            else:
                self.store.put(self.namespace, path, dict(to_record(data)), index=False)
            if data is None:
                self._loaded.pop(path, None)
            else:
                self._loaded[path] = data
